#!/usr/bin/env python3
"""PyTorch's peer of bench/gpu/kernels_bench.cpp: the same work of a training
step (memory-bound ops and the products), at the shapes that bench printed (its JSON lines are the
input, so both time the same rows), through PyTorch's eager kernels (one op
or the few an eager model runs for it; torch.compile would fuse some of
them, at a compile per shape). Median of 10 timed runs after 3 warm-ups
(CUDA events; the host clock on the CPU). Prints one JSON line per op. A
product on the GPU is timed twice: as PyTorch runs it by default (cuBLAS may
reduce split-K partials in bf16: allow_bf16_reduced_precision_reduction),
and with that off, as our products always run ("ms_strict").

    python3 bench/gpu/kernels_peer.py kernels-zt.jsonl [cuda|cpu]
"""
import json
import sys

import torch
import torch.nn.functional as F

from jsonl import json_rows
from peer_timing import median_ms


def rms_norm(x, w, eps=1e-5):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def norm(kind, x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5) if kind == "layernorm" else rms_norm(x, w)


def rope_angles(T, D, dev):
    """cos and sin (1, T, 1, D/2) in bf16 of RoPE's angles at theta 500000, as the bench's table."""
    ang = torch.arange(T, device=dev).float()[:, None] * (500000.0 ** (-torch.arange(0, D, 2, device=dev) / D))
    return ang.cos()[None, :, None, :].to(torch.bfloat16), ang.sin()[None, :, None, :].to(torch.bfloat16)


def rotate(x, cos, sin):
    """Interleaved channel pairs of x (B, T, H, D) rotated by the angles (sin negated: the inverse)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


def work(row, dev):
    """The callable for one row of kernels_bench's output (None: no peer)."""
    op, dims = row["op"], [int(d) for d in row["shape"].split("x")]
    bf = dict(device=dev, dtype=torch.bfloat16)
    rand = lambda *s, lo=-1.0, hi=1.0, **kw: torch.empty(*s, **{**bf, **kw}).uniform_(lo, hi)
    kind = "rmsnorm" if "rmsnorm" in op else "layernorm"
    if op.endswith("norm_forward") or op.endswith("norm_backward"):
        N, C = dims
        x, r_in, dy, dres = rand(N, C), rand(N, C), rand(N, C), rand(N, C)
        w, b = rand(C, lo=0.5, hi=1.5), (rand(C) if kind == "layernorm" else None)
        if op.startswith("residual_"):
            return lambda: norm(kind, x + r_in, w, b)
        if op.endswith("_forward"):
            return lambda: norm(kind, x, w, b)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = norm(kind, xg, wg, b)
        return lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True)[0] + dres
    if op == "add":
        N, C = dims
        a, b, out = rand(N, C), rand(N, C), torch.empty(N, C, **bf)
        return lambda: torch.add(a, b, out=out)
    if op == "gelu_forward":
        x = rand(*dims, lo=-4, hi=4)
        return lambda: F.gelu(x, approximate="tanh")
    if op.startswith("swiglu"):
        N, F2 = dims
        x = rand(N, F2, lo=-4, hi=4)
        if op == "swiglu_forward":
            return lambda: F.silu(x[:, : F2 // 2]) * x[:, F2 // 2:]
        xg = x.clone().requires_grad_()
        y = F.silu(xg[:, : F2 // 2]) * xg[:, F2 // 2:]
        dy = rand(N, F2 // 2)
        return lambda: torch.autograd.grad(y, xg, dy, retain_graph=True)
    if op == "rope_forward":
        B, T, H, D = dims
        q, cos, sin = rand(B, T, H, D), *rope_angles(T, D, dev)
        return lambda: rotate(q, cos, sin)
    if op.startswith("rope_split_qkv"):
        # Eager PyTorch's form of the fused product's split: q and k rotated
        # from views of the product's output, v a view (no copy); the
        # backward concatenates the gradients.
        B, T, Hq, Hkv, D = dims
        cos, sin = rope_angles(T, D, dev)
        if op.endswith("_forward"):
            qkv = rand(B, T, Hq + 2 * Hkv, D)
            return lambda: (rotate(qkv[:, :, :Hq], cos, sin), rotate(qkv[:, :, Hq:Hq + Hkv], cos, sin),
                            qkv[:, :, Hq + Hkv:])
        dq, dk, dv = rand(B, T, Hq, D), rand(B, T, Hkv, D), rand(B, T, Hkv, D)
        return lambda: torch.cat((rotate(dq, cos, -sin), rotate(dk, cos, -sin), dv), dim=2)
    if op.startswith("rope_packed_qkv"):
        # Eager PyTorch's rotation of the product's query and key heads (a
        # view of them in, a new tensor out; v stays a view).
        B, T, Hq, Hkv, D = dims
        cos, sin = rope_angles(T, D, dev)
        qkv = rand(B, T, Hq + 2 * Hkv, D)
        sign = 1 if op.endswith("_forward") else -1
        return lambda: rotate(qkv[:, :, :Hq + Hkv], cos, sign * sin)
    if op == "cross_entropy_fused":
        rows, Vp = dims
        V = row["vocab"]  # real columns; the rest padding
        logits = rand(rows, Vp, lo=-8, hi=8).requires_grad_()
        t = torch.randint(0, V, (rows,), device=dev)

        def ce():
            loss = F.cross_entropy(logits[:, :V], t)
            return torch.autograd.grad(loss, logits)
        return ce
    if op.startswith("embedding"):
        B, T, C = dims
        gpt2 = row["model"].startswith("gpt2")  # learned positions
        wte, wpe = rand(row["vocab"], C), (rand(T, C) if gpt2 else None)
        if op.endswith("_zipf"):  # ids as text repeats them: rank r with probability ~ 1 / r
            ranks = torch.arange(1, row["vocab"] + 1, dtype=torch.float64)
            ids = torch.multinomial(1.0 / ranks, B * T, replacement=True).view(B, T).to(dev)
        else:
            ids = torch.randint(0, row["vocab"], (B, T), device=dev)
        if op == "embedding_forward":
            return lambda: F.embedding(ids, wte) + wpe if gpt2 else F.embedding(ids, wte)
        wg = wte.clone().requires_grad_()
        pg = wpe.clone().requires_grad_() if gpt2 else None
        y = F.embedding(ids, wg) + pg if gpt2 else F.embedding(ids, wg)
        dout = rand(B, T, C)
        return lambda: torch.autograd.grad(y, [wg] + ([pg] if gpt2 else []), dout, retain_graph=True)
    if op in ("adamw_step", "global_norm", "zero_grads"):
        (P,) = dims
        p = torch.empty(P, device=dev).uniform_(-1, 1)
        p.grad = torch.empty(P, device=dev).uniform_(-1e-3, 1e-3)
        if op == "adamw_step":
            fused = {"fused": True} if dev == "cuda" else {}  # one kernel for all (CUDA only)
            opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, **fused)
            return opt.step
        if op == "global_norm":  # read on the host, as the trainer's clipping does
            return lambda: torch.linalg.vector_norm(p.grad).item()
        return p.grad.zero_
    kind = op.rsplit(".", 1)[-1]
    if kind.startswith("wgrad_chunks"):  # our dW in row chunks: the peer's is one product
        if not kind.endswith("*"):
            return None
        kind = "wgrad"
    if kind in ("forward", "forward_residual", "dgrad", "dgrad_add", "dgrad_gelu", "wgrad") and "tflops" in row:
        # A product: y (M, N) = x (M, K) W (N, K)^T + b (+ r), its input gradient
        # (GPT-2's mlp.out through the GeLU backward: two kernels here), and the
        # weight and bias gradients accumulated into f32, as autocast leaves them.
        M, K, N = dims
        x, w, dy = rand(M, K), rand(N, K, lo=-0.05, hi=0.05), rand(M, N)
        b = rand(N) if row["bias"] else None
        if kind == "forward":
            return lambda: F.linear(x, w, b)
        if kind == "forward_residual":  # a block's output layer and its residual connection, as models write it
            r = rand(M, N)
            return lambda: r + F.linear(x, w, b)
        if kind == "dgrad":
            return lambda: dy @ w
        if kind == "dgrad_add":  # into an existing sum, as autograd adds a second use's gradient
            dx = rand(M, K)
            return lambda: dx.addmm_(dy, w)
        if kind == "dgrad_gelu":
            pre = rand(M, K, lo=-4, hi=4)
            return lambda: torch.ops.aten.gelu_backward(dy @ w, pre, approximate="tanh")
        dw = torch.zeros(N, K, device=dev)
        db = torch.zeros(N, device=dev) if row["bias"] else None

        def wgrad():
            dw.add_(dy.t() @ x)
            if db is not None:
                db.add_(dy.sum(0))
        return wgrad
    return None


def main():
    rows = [r for r in json_rows(sys.argv[1]) if "op" in r]  # not the rate or race lines
    dev = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    torch.manual_seed(0)
    for row in rows:
        fn = work(row, dev)
        if fn is None:
            continue
        out = {"model": row["model"], "op": row["op"], "shape": row["shape"],
               "kernel": f"torch {torch.__version__} eager", "ms": round(median_ms(fn, dev), 4)}
        if "tflops" in row and dev == "cuda":
            flags = torch.backends.cuda.matmul
            default = flags.allow_bf16_reduced_precision_reduction
            flags.allow_bf16_reduced_precision_reduction = False
            try:
                out["ms_strict"] = round(median_ms(fn, dev), 4)
            finally:
                flags.allow_bf16_reduced_precision_reduction = default
        print(json.dumps(out))
        sys.stdout.flush()
        del fn
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
