#!/usr/bin/env python3
"""Logits of a Hugging Face GPT-2, Llama or Mixtral checkpoint, computed in float64
independently of Zettatron (and without the `transformers` package, which
Debian does not ship): a plain PyTorch forward pass in Hugging Face's own
conventions, so a test comparing it with Zettatron checks the converter.

  GPT2LMHeadModel   learned positions, LayerNorm, Conv1D weights stored
                    (in, out) - used as x @ W - c_attn columns q | k | v,
                    GeLU with the tanh approximation ("gelu_new"), head tied
                    to wte unless tie_word_embeddings is false.
  LlamaForCausalLM  RMSNorm, nn.Linear weights (out, in), RoPE in the
                    "rotate_half" layout (channel i pairs with i + D/2) with
                    optional Llama 3 frequency scaling, grouped-query
                    attention (kv head of query head h: h // (Hq / Hkv)),
                    SwiGLU MLP (down(silu(gate(x)) * up(x))).
  MixtralForCausalLM  Llama's blocks with a sparse MLP: softmax router over
                    the experts, each token's top k weights renormalised,
                    expert e = w2(silu(w1 x) * w3 x).

Usage: hf_logits.py HF_DIR TOKENS.safetensors OUT.safetensors
  HF_DIR  config.json + model.safetensors, or model.safetensors.index.json + shards
  TOKENS  tensor "tokens": (B, T) int32
  OUT     tensor "logits": (B, T, vocab_size) float32
Every tensor in HF_DIR must be used (known buffers aside), so a weight the
converter wrote under a wrong name fails here rather than being ignored.
"""
import json
import math
import os
import re
import sys

import torch

import st_io

BUFFERS = re.compile(r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$|^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


class Weights:
    """HF tensors as float64, with a record of which were read."""

    def __init__(self, d):
        index = os.path.join(d, "model.safetensors.index.json")
        self.t = {}
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            for fn in sorted(set(weight_map.values())):
                part, _ = st_io.load(os.path.join(d, fn))
                for name in part:
                    if weight_map.get(name) != fn:
                        sys.exit(f"{fn}: tensor {name!r} is not mapped to this file by the index")
                self.t.update(part)
            if set(weight_map) != set(self.t):
                sys.exit(f"index and shards disagree: {sorted(set(weight_map) ^ set(self.t))}")
        else:
            self.t, _ = st_io.load(os.path.join(d, "model.safetensors"))
        self.used = set()

    def __contains__(self, name):
        return name in self.t

    def __getitem__(self, name):
        self.used.add(name)
        return self.t[name].to(torch.float64)

    def check_all_used(self):
        left = [n for n in self.t if n not in self.used and not BUFFERS.match(n)]
        if left:
            sys.exit(f"tensors not used by the model: {sorted(left)}")


def attend(q, k, v):
    """Causal softmax attention; q, k, v: (B, H, T, D)."""
    T, D = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def split_heads(x, heads):
    B, T, W = x.shape
    return x.reshape(B, T, heads, W // heads).transpose(1, 2)


def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def layer_norm(x, w, b, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logits(cfg, W, tokens):
    p = "transformer." if "transformer.wte.weight" in W else ""
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    B, T = tokens.shape
    x = W[p + "wte.weight"][tokens] + W[p + "wpe.weight"][:T].unsqueeze(0)
    for i in range(cfg["n_layer"]):
        h = f"{p}h.{i}."
        a = layer_norm(x, W[h + "ln_1.weight"], W[h + "ln_1.bias"], eps)
        qkv = a @ W[h + "attn.c_attn.weight"] + W[h + "attn.c_attn.bias"]  # Conv1D: (in, out)
        q, k, v = (split_heads(t, H) for t in qkv.split(C, dim=-1))
        x = x + merge_heads(attend(q, k, v)) @ W[h + "attn.c_proj.weight"] + W[h + "attn.c_proj.bias"]
        m = layer_norm(x, W[h + "ln_2.weight"], W[h + "ln_2.bias"], eps)
        f = gelu_tanh(m @ W[h + "mlp.c_fc.weight"] + W[h + "mlp.c_fc.bias"])
        x = x + f @ W[h + "mlp.c_proj.weight"] + W[h + "mlp.c_proj.bias"]
    x = layer_norm(x, W[p + "ln_f.weight"], W[p + "ln_f.bias"], eps)
    tied = cfg.get("tie_word_embeddings", True)
    head = W[p + "wte.weight"] if tied else W["lm_head.weight"]
    return x @ head.T


def llama_inv_freq(cfg, D):
    """Rotation frequency of channel pair (i, i + D/2), i < D/2, float64."""
    theta = cfg.get("rope_theta", 10000.0)
    freqs = [theta ** (-2.0 * i / D) for i in range(D // 2)]
    rs = cfg.get("rope_scaling")
    if rs is not None and (rs.get("rope_type") or rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        L = rs["original_max_position_embeddings"]
        scaled = []
        for fr in freqs:
            wavelength = 2.0 * math.pi / fr
            if wavelength < L / hi:  # short wavelengths: unchanged
                scaled.append(fr)
            elif wavelength > L / lo:  # long wavelengths: slowed by factor
                scaled.append(fr / factor)
            else:  # in between: interpolate in L / wavelength
                s = (L / wavelength - lo) / (hi - lo)
                scaled.append((1.0 - s) * fr / factor + s * fr)
        freqs = scaled
    elif rs is not None and (rs.get("rope_type") or rs.get("type")) != "default":
        sys.exit(f"unsupported rope_scaling {rs}")
    return torch.tensor(freqs, dtype=torch.float64)


def rope_rotate_half(x, inv_freq):
    """x: (B, H, T, D); channel i is rotated together with channel i + D/2."""
    T, half = x.shape[-2], x.shape[-1] // 2
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def mixtral_experts(cfg, W, p, h):
    """MixtralSparseMoeBlock: softmax router, top k renormalised, experts
    down(silu(w1 x) * w3 x) = w2(...); every expert runs on every token and
    a token keeps its k experts' outputs."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    probs = torch.softmax(h @ W[p + "gate.weight"].T, dim=-1)
    top_p, top_i = probs.topk(k, dim=-1)
    top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        w = f"{p}experts.{e}."
        y = (torch.nn.functional.silu(h @ W[w + "w1.weight"].T) * (h @ W[w + "w3.weight"].T)) @ W[w + "w2.weight"].T
        out = out + (top_p * (top_i == e)).sum(dim=-1, keepdim=True) * y
    return out


def llama_logits(cfg, W, tokens):
    C, Hq = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or Hq
    D, eps = C // Hq, cfg["rms_norm_eps"]
    inv_freq = llama_inv_freq(cfg, D)
    x = W["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        m = f"model.layers.{i}."
        a = rms_norm(x, W[m + "input_layernorm.weight"], eps)
        q = rope_rotate_half(split_heads(a @ W[m + "self_attn.q_proj.weight"].T, Hq), inv_freq)
        k = rope_rotate_half(split_heads(a @ W[m + "self_attn.k_proj.weight"].T, Hkv), inv_freq)
        v = split_heads(a @ W[m + "self_attn.v_proj.weight"].T, Hkv)
        k, v = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
        x = x + merge_heads(attend(q, k, v)) @ W[m + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[m + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "mixtral":
            x = x + mixtral_experts(cfg, W, m + "block_sparse_moe.", h)
            continue
        gate, up = h @ W[m + "mlp.gate_proj.weight"].T, h @ W[m + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ W[m + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    tied = cfg.get("tie_word_embeddings", False)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    return x @ head.T


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    hf_dir, tokens_path, out_path = sys.argv[1:]
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    W = Weights(hf_dir)
    tokens = st_io.load(tokens_path)[0]["tokens"].long()
    if cfg["model_type"] == "gpt2":
        logits = gpt2_logits(cfg, W, tokens)
    elif cfg["model_type"] in ("llama", "mixtral"):
        logits = llama_logits(cfg, W, tokens)
    else:
        sys.exit(f"unsupported model_type {cfg['model_type']!r}")
    if cfg.get("tie_word_embeddings", cfg["model_type"] == "gpt2") and "lm_head.weight" in W:
        W["lm_head.weight"]  # a stored copy of a tied head is allowed
    W.check_all_used()
    assert logits.shape == (*tokens.shape, cfg["vocab_size"]), logits.shape
    st_io.save(out_path, {"logits": logits.to(torch.float32)})


if __name__ == "__main__":
    main()
