#!/usr/bin/python3
"""The PyTorch peer of the generation benchmark: a GPT-2-style model (by
default that of configs/bench.toml: 6 layers, width 384, 6 heads, 256
positions, GPT-2 vocabulary, fp32, tied embeddings; --device cuda --dtype
bf16 and GPT-2 124M's sizes on a GPU), random weights, sampling one sequence
with a KV cache the way Hugging Face's GPT-2 does it (each layer's past keys
and values concatenated with the new row's; the head on the last position;
top-k with temperature), in inference mode, on all cores or the GPU. Prints
one JSON line: tokens/s (median of the runs after a warm-up), the thread
count."""
import argparse
import json
import math
import statistics
import time

import os
import sys

import torch
import torch.nn.functional as F

# The training benchmark's GPT-2 modules (the same parameters), run here a
# step at a time over a cache.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from pytorch_peer import GPT  # noqa: E402


def block_step(b, x, past):
    """One block of x (1, T, C) at the positions after past's; past: (k, v) (1, H, P, D) or None.
    Returns the block's output and the new (k, v)."""
    B, T, C = x.shape
    q, k, v = b.qkv(b.ln1(x)).split(C, dim=2)
    q, k, v = (t.view(B, T, b.H, C // b.H).transpose(1, 2) for t in (q, k, v))
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // b.H)
    if T > 1:  # the prompt: causal among its rows (no past then)
        att = att + torch.full((T, T), float("-inf"), device=x.device, dtype=x.dtype).triu(1)
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = x + b.proj(y)
    return x + b.fc_out(F.gelu(b.fc(b.ln2(x)), approximate="tanh")), (k, v)


def step(model, idx, pos, pasts):
    """The last position's logits of idx (1, T) at positions [pos, pos + T), and the new pasts."""
    x = model.wte(idx) + model.wpe(torch.arange(pos, pos + idx.shape[1], device=idx.device))
    new = []
    for b, past in zip(model.blocks, pasts):
        x, kv = block_step(b, x, past)
        new.append(kv)
    return model.lnf(x[:, -1]) @ model.wte.weight.t(), new


def generate(model, prompt, tokens, temperature, top_k, generator):
    idx, pos, pasts = prompt, 0, [None] * len(model.blocks)
    out = []
    for _ in range(tokens):
        logits, pasts = step(model, idx, pos, pasts)
        pos += idx.shape[1]
        vals, ids = torch.topk(logits[0].float() / temperature, top_k)
        pick = ids[torch.multinomial(vals.softmax(-1), 1, generator=generator)]
        out.append(int(pick))
        idx = pick.view(1, 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--prompt", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    a = ap.parse_args()
    assert a.prompt + a.tokens <= a.seq, "the benchmark stays within the model's positions"
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = GPT(a.vocab, a.seq, a.layers, a.width, a.heads).to(device=a.device, dtype=dtype).eval()
    prompt = torch.randint(0, a.vocab, (1, a.prompt)).to(a.device)
    generator = torch.Generator(device=a.device).manual_seed(1)
    times = []
    with torch.inference_mode():
        for run in range(a.runs + 1):
            t0 = time.perf_counter()
            generate(model, prompt, a.tokens, 0.8, 40, generator)
            if run > 0:  # the first run pays for allocation and warm-up
                times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    print(json.dumps({"peer": "pytorch", "version": torch.__version__, "threads": torch.get_num_threads(),
                      "device": a.device, "dtype": a.dtype,
                      "seconds": seconds, "tokens_per_s": a.tokens / seconds}))


if __name__ == "__main__":
    main()
