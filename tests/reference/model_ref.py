#!/usr/bin/python3
"""PyTorch reference for Zettatron's model parity tests.

Written independently of the C++ code: plain PyTorch modules and autograd,
torch.optim.AdamW and clip_grad_norm_. The C++ test writes into DIR:
  config.json        model + optimisation settings
  weights.safetensors initial parameters under Zettatron's names
  batches.safetensors "tokens" and "targets", (steps, B, T) int32
and this script writes DIR/ref.safetensors with
  logits (B, T, Vp) of batch 0, loss (scalar), grad.<name> for every parameter
  (on batch 0, before any update), losses (steps) of the training run and
  final.<name>, the weights after the last step.

Conventions shared with Zettatron (they are the model's definition):
  qkv weight rows = [q (Hq*D) | k (Hkv*D) | v (Hkv*D)]; SwiGLU mlp.in rows =
  [gate (F) | up (F)]; RoPE rotates interleaved channel pairs (2i, 2i+1)
  (Meta's layout); embeddings are padded to Vp rows, logits beyond the real
  vocabulary V are excluded from the loss.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

import st_io

torch.set_num_threads(1)


def rope_freqs(cfg):
    D = cfg["d_model"] // cfg["n_head"]
    theta = cfg["rope_theta"]
    freqs = []
    for i in range(D // 2):
        f = theta ** (-2.0 * i / D)
        if cfg["rope_scaling"]:
            factor, lo, hi = cfg["rope_scaling_factor"], cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"]
            orig = cfg["rope_original_max_position"]
            wavelen = 2 * math.pi / f
            if wavelen < orig / hi:
                pass
            elif wavelen > orig / lo:
                f = f / factor
            else:
                smooth = (orig / wavelen - lo) / (hi - lo)
                f = (1 - smooth) * f / factor + smooth * f
        freqs.append(f)
    return torch.tensor(freqs, dtype=torch.float64)


def apply_rope(x, cos, sin):
    # x (B, T, H, D); rotate pairs (2i, 2i+1) by angle t * freq_i.
    xe, xo = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([xe * c - xo * s, xe * s + xo * c], dim=-1)
    return out.flatten(-2)


class Reference(torch.nn.Module):
    def __init__(self, cfg, weights):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict()
        for name, t in weights.items():
            self.p[name.replace(".", "__")] = torch.nn.Parameter(t.to(torch.float32).clone())
        if cfg["arch"] == "llama3":
            T = cfg["max_seq_len"]
            ang = torch.arange(T, dtype=torch.float64)[:, None] * rope_freqs(cfg)[None, :]
            self.cos, self.sin = ang.cos().float(), ang.sin().float()

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def norm(self, x, prefix):
        eps = self.cfg["norm_eps"]
        if self.cfg["arch"] == "gpt2":
            return F.layer_norm(x, (x.shape[-1],), self.w(prefix + ".weight"), self.w(prefix + ".bias"), eps)
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * rstd * self.w(prefix + ".weight")

    def linear(self, x, prefix, bias=True):
        b = self.w(prefix + ".bias") if (bias and self.cfg["arch"] == "gpt2") else None
        return F.linear(x, self.w(prefix + ".weight"), b)

    def forward(self, tokens):
        cfg = self.cfg
        B, T = tokens.shape
        C, Hq, Hkv = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
        D = C // Hq
        x = self.w("embed.wte")[tokens.long()]
        if cfg["arch"] == "gpt2":
            x = x + self.w("embed.wpe")[:T][None]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for i in range(cfg["n_layer"]):
            p = f"layers.{i}."
            h = self.norm(x, p + "attn_norm")
            qkv = self.linear(h, p + "attn.qkv")
            q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
            q, k, v = q.view(B, T, Hq, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
            if cfg["arch"] == "llama3":
                q, k = apply_rope(q, self.cos[:T], self.sin[:T]), apply_rope(k, self.cos[:T], self.sin[:T])
            k = k.repeat_interleave(Hq // Hkv, dim=2)
            v = v.repeat_interleave(Hq // Hkv, dim=2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1) @ v
            att = att.transpose(1, 2).reshape(B, T, C)
            x = x + self.linear(att, p + "attn.proj")
            h = self.norm(x, p + "mlp_norm")
            if cfg.get("n_expert", 0) > 0:
                x = x + self.experts(h, p)
                continue
            u = self.linear(h, p + "mlp.in")
            if cfg["arch"] == "gpt2":
                a = F.gelu(u, approximate="tanh")
            else:
                g, up = u.split([cfg["d_ff"], cfg["d_ff"]], dim=-1)
                a = F.silu(g) * up
            x = x + self.linear(a, p + "mlp.out")
        x = self.norm(x, "final_norm")
        head = self.w("embed.wte") if cfg["tied_embeddings"] else self.w("lm_head.weight")
        return x @ head.t()

    def experts(self, h, p):
        # Mixture of experts: every expert runs on every token (no dispatch)
        # and each token keeps the outputs of its top k, weighted.
        cfg = self.cfg
        E, k, Fw = cfg["n_expert"], cfg["expert_top_k"], cfg["d_ff"]
        x = h.reshape(-1, h.shape[-1])
        router_logits = x @ self.w(p + "mlp.router.weight").t()
        probs = torch.softmax(router_logits, dim=-1)
        top_p, top_i = probs.topk(k, dim=-1)
        if cfg["expert_normalize"]:
            top_p = top_p / top_p.sum(-1, keepdim=True)
        # A capacity: each expert keeps its first ceil(c N k / E) slots in slot
        # order (token-major), a dropped slot's output is not added.
        chosen = F.one_hot(top_i, E)  # (N, k, E)
        c = cfg.get("expert_capacity_factor", 0.0)
        if c > 0:
            cap = math.ceil(c * x.shape[0] * k / E)
            rank = chosen.reshape(-1, E).cumsum(0).reshape(chosen.shape)  # 1 + the slots before, per expert
            chosen = chosen * (rank <= cap)
        out = torch.zeros_like(x)
        w_in, w_out = self.w(p + "mlp.experts.in.weight"), self.w(p + "mlp.experts.out.weight")
        for e in range(E):
            g, up = (x @ w_in[e].t()).split([Fw, Fw], dim=-1)
            gate = (top_p * chosen[..., e]).sum(-1, keepdim=True)  # 0 where e is not chosen (or dropped)
            out = out + gate * ((F.silu(g) * up) @ w_out[e].t())
        # Switch load balancing: E sum_e f_e P_e, f_e the share of slots (no gradient).
        f = F.one_hot(top_i, E).sum(dim=(0, 1)).to(torch.float32) / (x.shape[0] * k)
        self.aux = self.aux + cfg["router_aux_loss"] * E * (f * probs.mean(0)).sum()
        # ST-MoE's router z-loss: the mean of logsumexp(logits)^2.
        self.aux = self.aux + cfg["router_z_loss"] * (torch.logsumexp(router_logits, dim=-1) ** 2).mean()
        # A shared expert: a SwiGLU MLP every token goes through, unweighted.
        Fs = cfg.get("shared_expert_ff", 0)
        if Fs > 0:
            g, up = (x @ self.w(p + "mlp.shared.in.weight").t()).split([Fs, Fs], dim=-1)
            out = out + (F.silu(g) * up) @ self.w(p + "mlp.shared.out.weight").t()
        return out.reshape(h.shape)

    def loss(self, tokens, targets):
        # Returns the cross-entropy (what is reported) and the objective
        # (cross-entropy + the blocks' load-balancing losses, what is trained).
        V = self.cfg["vocab_size"]
        self.aux = torch.zeros(())
        logits = self.forward(tokens)
        ce = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1).long())
        return ce, ce + self.aux, logits


def lr_at(o, step):
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    span = max(1, o["steps"] - o["warmup_steps"])
    progress = min(1.0, max(0.0, (step - o["warmup_steps"]) / span))
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * progress))


def main(d):
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    weights, _ = st_io.load(f"{d}/weights.safetensors")
    batches, _ = st_io.load(f"{d}/batches.safetensors")
    names = list(weights.keys())
    model = Reference(cfg, weights)
    out = {}
    # Gradients on batch 0 at the initial weights.
    loss, objective, logits = model.loss(batches["tokens"][0], batches["targets"][0])
    objective.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for n in names:
        out["grad." + n] = model.w(n).grad.detach().clone()
    # Training run with AdamW, the cosine schedule and clipping.
    o = cfg["optim"]
    no_decay = set(cfg["no_decay"])
    decay_params = [model.w(n) for n in names if n not in no_decay]
    plain_params = [model.w(n) for n in names if n in no_decay]
    opt = torch.optim.AdamW(
        [{"params": decay_params, "weight_decay": o["weight_decay"]}, {"params": plain_params, "weight_decay": 0.0}],
        lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    losses = []
    accum = cfg["grad_accum"]
    for step in range(o["steps"]):
        opt.zero_grad()
        tokens, targets = batches["tokens"][step], batches["targets"][step]
        total = 0.0
        for mb_tokens, mb_targets in zip(tokens.chunk(accum), targets.chunk(accum)):
            mb_loss, mb_objective, _ = model.loss(mb_tokens, mb_targets)
            (mb_objective / accum).backward()
            total += mb_loss.item() / accum
        losses.append(total)
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), o["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(o, step)
        opt.step()
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    for n in names:
        out["final." + n] = model.w(n).detach().clone()
    st_io.save(f"{d}/ref.safetensors", out)


if __name__ == "__main__":
    main(sys.argv[1])
