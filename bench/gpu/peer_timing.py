"""Timing shared by the PyTorch peers in bench/gpu: the median of 10 timed
runs after 3 warm-ups, queued back to back and timed by CUDA events on a GPU
(the host clock on the CPU, where the peers only check themselves), in
milliseconds."""
import statistics
import time

import torch


def median_ms(fn, device="cuda"):
    for _ in range(3):
        fn()
    if device == "cuda":
        # Queued back to back, the events read after the last run (as
        # median_time.h times ours): the GPU's time per run, not the launch
        # delay of work started on an idle GPU.
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(11)]
        marks[0].record()
        for i in range(10):
            fn()
            marks[i + 1].record()
        torch.cuda.synchronize()
        return statistics.median([marks[i].elapsed_time(marks[i + 1]) for i in range(10)])
    times = []
    for _ in range(10):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
