"""What a GPU benchmark reads from a training run's metrics.jsonl (bench/gpu/run.sh)."""
import json
import statistics

WARMUP_STEPS = 5  # the first steps' rows are left out (cuBLASLt plans, cuDNN graphs, the allocator's growth)


def measured(path):
    """Median tokens/s and MFU of the steps after the warm-up, and the peak GiB; None when the run left no such step."""
    try:
        rows = [json.loads(line) for line in open(path) if '"tokens_per_s"' in line][WARMUP_STEPS:]
    except OSError:
        return None
    if not rows:
        return None
    return (statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r["mfu"] for r in rows),
            max(r["peak_memory_bytes"]["total"] for r in rows) / 2**30)
