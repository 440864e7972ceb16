#!/usr/bin/env python3
"""PyTorch's peer of bench/gpu/attention_bench.cpp: causal GQA attention
through F.scaled_dot_product_attention (flash backend where available), bf16,
forward and forward + backward, median of 10 timed runs after 3 warm-ups (CUDA
events), on the same two shapes. Prints one JSON line per shape."""
import json

import torch
import torch.nn.functional as F

from peer_timing import median_ms


def main():
    torch.manual_seed(0)
    for name, B, T, Hq, Hkv, D in [("gpt2-124m", 16, 1024, 12, 12, 64), ("llama3-1b", 8, 1024, 32, 8, 64)]:
        def t(H, grad):
            return torch.empty(B, H, T, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1).requires_grad_(grad)
        q, k, v = t(Hq, True), t(Hkv, True), t(Hkv, True)
        dout = torch.empty(B, Hq, T, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)

        def both():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
            out.backward(dout)

        flops = 4.0 * B * Hq * D * T * T / 2.0
        f, fb = median_ms(fwd), median_ms(both)
        print(json.dumps({"shape": name, "kernel": f"torch {torch.__version__} sdpa", "forward_ms": round(f, 4),
                          "forward_backward_ms": round(fb, 4), "forward_tflops": round(flops / (f * 1e9), 1),
                          "forward_backward_tflops": round(3.5 * flops / (fb * 1e9), 1)}))


if __name__ == "__main__":
    main()
