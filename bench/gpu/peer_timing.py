"""Timing shared by the PyTorch peers in bench/gpu: the median of 10 timed
runs after 3 warm-ups, by CUDA events on a GPU (the host clock on the CPU,
where the peers only check themselves), in milliseconds."""
import statistics
import time

import torch


def median_ms(fn, device="cuda"):
    for _ in range(3):
        fn()
    times = []
    for _ in range(10):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
