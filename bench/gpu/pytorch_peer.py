#!/usr/bin/env python3
"""The PyTorch peer of the GPU training benchmark (run on the GPU machine with
its PyTorch 2.x + CUDA): the same model as the Zettatron config it is compared
with, trained the way a PyTorch user would - fp32 weights, bf16 autocast,
torch.compile, F.scaled_dot_product_attention (flash), fused AdamW - on random
tokens. Prints one JSON line: tokens/s (median of the timed steps), step time,
peak memory.

  --arch gpt2   GPT-2 (LayerNorm, GeLU-tanh, biases, learned positions, tied)
  --arch llama  Llama 3 (RMSNorm, SwiGLU, RoPE, GQA, no biases, tied as 1B)
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        C, self.H, self.Hkv, self.D = a.d_model, a.n_head, a.n_kv_head, a.d_model // a.n_head
        bias = a.arch == "gpt2"
        Norm = nn.LayerNorm if a.arch == "gpt2" else (lambda c: nn.RMSNorm(c, eps=1e-5))
        self.ln1, self.ln2 = Norm(C), Norm(C)
        self.qkv = nn.Linear(C, (self.H + 2 * self.Hkv) * self.D, bias=bias)
        self.proj = nn.Linear(C, C, bias=bias)
        self.llama = a.arch == "llama"
        self.fc = nn.Linear(C, (2 if self.llama else 1) * a.d_ff, bias=bias)
        self.fc_out = nn.Linear(a.d_ff, C, bias=bias)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=2)
        q = q.view(B, T, self.H, self.D).transpose(1, 2)
        k = k.view(B, T, self.Hkv, self.D).transpose(1, 2)
        v = v.view(B, T, self.Hkv, self.D).transpose(1, 2)
        if self.llama:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.Hkv != self.H)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.fc(self.ln2(x))
        if self.llama:
            g, u = h.chunk(2, dim=-1)
            h = F.silu(g) * u
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.fc_out(h)


def rope(x, cos, sin):  # rotate-half form; x (B, H, T, D)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.wte = nn.Embedding(a.vocab, a.d_model)
        self.wpe = nn.Embedding(a.seq, a.d_model) if a.arch == "gpt2" else None
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.n_layer))
        self.lnf = nn.LayerNorm(a.d_model) if a.arch == "gpt2" else nn.RMSNorm(a.d_model, eps=1e-5)
        D = a.d_model // a.n_head
        inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.outer(torch.arange(a.seq).float(), inv)
        self.register_buffer("cos", torch.cat((ang.cos(), ang.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((ang.sin(), ang.sin()), -1), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, self.cos[:T], self.sin[:T])
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    if a.arch == "gpt2":  # GPT-2 124M (vocab padded to 50304 as Zettatron pads it)
        a.vocab, a.n_layer, a.d_model, a.n_head, a.n_kv_head, a.d_ff = 50304, 12, 768, 12, 12, 3072
    else:  # Llama 3.2 1B
        a.vocab, a.n_layer, a.d_model, a.n_head, a.n_kv_head, a.d_ff = 128256, 16, 2048, 32, 8, 8192
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    model = Model(a).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = model if a.no_compile else torch.compile(model)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    print(json.dumps({"version": torch.__version__, "arch": a.arch, "params": n_params, "batch": a.batch,
                      "seq": a.seq, "step_s": t, "tokens_per_s": a.batch * a.seq / t, "loss": float(loss),
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                      "compiled": not a.no_compile}))


if __name__ == "__main__":
    main()
