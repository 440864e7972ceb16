#!/bin/bash
# Data-parallel communication per step against the theory, per ZeRO stage.
#
# Weak scaling means nothing on a 2-core machine, so this measures what can
# be measured: the bytes each rank sends per step (from metrics.jsonl, the
# process group's own accounting) against the ring volumes, with one
# micro-batch per rank per step - ZeRO-0: all-reduce of the f32 gradients,
# 2 (p-1)/p x 4 bytes per parameter; ZeRO-1 and 2: reduce-scatter of the
# gradients plus all-gather of the (f32) parameters, the same 2x; ZeRO-3:
# parameters gathered in forward and again in backward plus the gradient
# reduce-scatter, 3x - and the overlap fraction (the share of the time
# communication was in flight that the step did not wait for).
#
# Usage: bench/dp/run.sh [BUILD_DIR]   (prints a markdown table)
set -euo pipefail
mpi=(mpirun --oversubscribe --allow-run-as-root)
source "$(dirname "$0")/../parallel_config.sh"
parallel_bench_setup dp "${1:-build}"
write_bench_config "$tmp/cfg.toml" "$data" 2

echo "| ranks | ZeRO | params (M) | bytes sent / step / rank (MB) | theory (MB) | ratio | overlap | exposed comm / step (ms) |"
echo "|---|---|---|---|---|---|---|---|"
for np in 2 4; do
  for zero in 0 1 2 3; do
    run="$tmp/np$np-z$zero"
    "${mpi[@]}" -np $np "$bin" train "$tmp/cfg.toml" --set train.run_dir="$run" \
      --set train.micro_batch=$((8 / np)) --set parallel.zero_stage=$zero --set parallel.bucket_mb=4 > /dev/null
    /usr/bin/python3 - "$run" "$np" "$zero" <<'PY'
import json, sys
run, p, zero = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"comm"' in l]
steps = steps[1:]  # the first step warms up
cfg = open(run + "/config.toml").read()
# Parameter elements in the flat buffers (what is reduced): from the run's own log.
log = open(run + "/train.log").read()
import re
params = float(re.search(r"([0-9.]+)M parameters", log).group(1)) * 1e6
sent = sum(s["comm"]["bytes"] for s in steps) / len(steps)
theory = (3 if zero == 3 else 2) * 4 * params * (p - 1) / p
busy = sum(s["comm"]["busy_s"] for s in steps)
exposed = sum(s["comm"]["exposed_s"] for s in steps)
overlap = 1 - exposed / busy if busy > 0 else 1
print(f"| {p} | {zero} | {params/1e6:.2f} | {sent/1e6:.2f} | {theory/1e6:.2f} | {sent/theory:.3f} | {overlap:.2f} | {1e3*exposed/len(steps):.1f} |")
PY
  done
done
