#!/bin/bash
# Tensor-parallel communication per step against the theory, with and
# without sequence parallelism.
#
# On a 2-core machine speed-up means nothing, so this measures what can be
# measured: the bytes each rank sends per step on the tensor-parallel group
# (metrics.jsonl "comm_tp", the process group's own accounting) against the
# ring volumes, and the share of the time tensor-parallel communication was
# in flight that the step did not wait for. Per micro-batch of N tokens,
# width C, L layers, r = (p-1)/p, f32:
#   without SP: (4L + 2) all-reduces of N x C (embedding, proj and mlp_out
#     outputs, the two column-parallel input gradients per layer, d lnf):
#     2r x 4 (4L + 2) N C bytes, + the cross-entropy's 3N floats all-reduced.
#   with SP: each all-reduce becomes reduce-scatter + all-gather (the same
#     bytes) and backward all-gathers each layer's two norm outputs again
#     (+ r x 4 x 2L N C), + the norm weight gradients all-reduced.
# Overlap: the column-parallel input-gradient reductions (and under SP the
# re-gathers) run while the weight gradients are computed; the forward
# reductions are on the critical path (nothing to overlap them with).
#
# Usage: bench/tp/run.sh [BUILD_DIR]   (prints a markdown table)
set -euo pipefail
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
source "$(dirname "$0")/../parallel_config.sh"
parallel_bench_setup tp "${1:-build}"
write_bench_config "$tmp/cfg.toml" "$data" 4

echo "| tp | SP | bytes sent / step / rank (MB) | theory (MB) | ratio | overlap | exposed tp comm / step (ms) | step (ms) |"
echo "|---|---|---|---|---|---|---|---|"
for np in 2 4; do
  for sp in false true; do
    run="$tmp/tp$np-$sp"
    "${mpi[@]}" -np $np "$bin" train "$tmp/cfg.toml" --set train.run_dir="$run" --set parallel.tp=$np \
      --set parallel.sequence_parallel=$sp > /dev/null
    /usr/bin/python3 - "$run" "$np" "$sp" <<'PY'
import json, sys
run, p, sp = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "true"
steps = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"comm_tp"' in l][1:]  # the first step warms up
N, C, L, micro = 4 * 128, 256, 4, 2  # micro_batch x seq_len, d_model, layers, micro-batches per step
r = (p - 1) / p
stream = (4 * L + 2) * N * C
per_micro = 4 * (2 * r * stream + 2 * r * 3 * N)
if sp:
    per_micro += 4 * (r * 2 * L * N * C + 2 * r * (4 * C * L + 2 * C))
theory = micro * per_micro + 8 * (p - 1)
sent = sum(s["comm_tp"]["bytes"] for s in steps) / len(steps)
busy = sum(s["comm_tp"]["busy_s"] for s in steps)
exposed = sum(s["comm_tp"]["exposed_s"] for s in steps)
overlap = max(0.0, min(1.0, 1 - exposed / busy)) if busy > 0 else 1
step = sum(s["time_s"]["step"] for s in steps) / len(steps)
print(f"| {p} | {'on' if sp else 'off'} | {sent/1e6:.2f} | {theory/1e6:.2f} | {sent/theory:.4f} | {overlap:.2f} | {1e3*exposed/len(steps):.1f} | {1e3*step:.0f} |")
PY
  done
done
