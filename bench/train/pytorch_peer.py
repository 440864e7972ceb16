#!/usr/bin/python3
"""The PyTorch peer of the training benchmark: the same GPT-2-style model as
configs/bench.toml (6 layers, width 384, 6 heads, T=256, B=8, GPT-2 vocabulary,
fp32, AdamW, tied embeddings), trained on random tokens with PyTorch's own
modules, on all cores. With --model moe, the mixture-of-experts model of
configs/bench-moe.toml (Llama blocks: RMSNorm, RoPE, grouped-query
attention; 8 SwiGLU experts, top 2 renormalised, the Switch load-balancing
loss) with Hugging Face Mixtral's expert loop (per expert: its tokens by
torch.where, its MLP, index_add_ back). Prints one JSON line: tokens/s
(median of the timed steps), step time and the thread count."""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.H = H

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H) + mask[:T, :T]
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, C, H):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1))

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.w, self.eps = nn.Parameter(torch.ones(C)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


def rotate_half(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class SparseMoe(nn.Module):
    """Mixtral's sparse MLP (HF MixtralSparseMoeBlock's loop)."""

    def __init__(self, C, Fw, E, k):
        super().__init__()
        self.gate = nn.Linear(C, E, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(C, Fw, bias=False) for _ in range(E))
        self.w3 = nn.ModuleList(nn.Linear(C, Fw, bias=False) for _ in range(E))
        self.w2 = nn.ModuleList(nn.Linear(Fw, C, bias=False) for _ in range(E))
        self.E, self.k = E, k

    def forward(self, x):
        B, T, C = x.shape
        h = x.view(-1, C)
        probs = self.gate(h).softmax(-1)
        weights, chosen = probs.topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        mask = F.one_hot(chosen, self.E).permute(2, 1, 0)  # (E, k, N)
        for e in range(self.E):
            slot, token = torch.where(mask[e])
            if token.numel() == 0:
                continue
            xe = h[token]
            ye = self.w2[e](F.silu(self.w1[e](xe)) * self.w3[e](xe)) * weights[token, slot, None]
            out.index_add_(0, token, ye)
        f = mask.sum(dim=(1, 2)).float() / (h.shape[0] * self.k)
        self.aux = self.E * (f * probs.mean(0)).sum()
        return out.view(B, T, C)


class MoeBlock(nn.Module):
    def __init__(self, C, H, Hkv, Fw, E, k):
        super().__init__()
        self.n1, self.n2 = RMSNorm(C), RMSNorm(C)
        D = C // H
        self.q, self.kv = nn.Linear(C, C, bias=False), nn.Linear(C, 2 * Hkv * D, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.moe = SparseMoe(C, Fw, E, k)
        self.H, self.Hkv, self.D = H, Hkv, D

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        a = self.n1(x)
        q = self.q(a).view(B, T, self.H, self.D).transpose(1, 2)
        k, v = (t.view(B, T, self.Hkv, self.D).transpose(1, 2) for t in self.kv(a).split(self.Hkv * self.D, dim=2))
        q, k = rotate_half(q, cos, sin), rotate_half(k, cos, sin)
        k, v = (t.repeat_interleave(self.H // self.Hkv, dim=1) for t in (k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.D) + mask[:T, :T]
        x = x + self.o((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.moe(self.n2(x))


class MoeLM(nn.Module):
    def __init__(self, V, T, L, C, H, Hkv, Fw, E, k, aux):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        nn.init.normal_(self.wte.weight, std=0.02)
        self.blocks = nn.ModuleList(MoeBlock(C, H, Hkv, Fw, E, k) for _ in range(L))
        self.norm, self.aux = RMSNorm(C), aux
        D = C // H
        inv = 10000.0 ** (-torch.arange(0, D, 2).float() / D)
        ang = torch.arange(T).float()[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1))

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, self.mask, self.cos[:T], self.sin[:T])
        logits = self.norm(x) @ self.wte.weight.t()
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return ce + self.aux * sum(b.moe.aux for b in self.blocks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--model", choices=["gpt2", "moe"], default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model == "moe":
        model = MoeLM(a.vocab, a.seq, a.layers, a.width, a.heads, a.kv_heads, a.ff, a.experts, a.top_k, 0.01)
    else:
        model = GPT(a.vocab, a.seq, a.layers, a.width, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for step in range(a.steps + 1):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq))
        tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step > 0:  # the first step pays for allocation and warm-up
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    print(json.dumps({"peer": "pytorch", "version": torch.__version__, "threads": torch.get_num_threads(),
                      "step_s": step_s, "tokens_per_s": a.batch * a.seq / step_s, "loss": loss.item()}))


if __name__ == "__main__":
    main()
