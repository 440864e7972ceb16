#!/bin/bash
# Context-parallel (ring attention) communication per step against the
# theory, and the step against the single process on the same machine.
#
# On a 2-core machine the ranks share the cores, so speed-up means nothing;
# what can be measured: the bytes each rank sends per step on the cp group
# (metrics.jsonl "comm_cp", the process group's own accounting) against the
# ring's volume, and the share of the time the ring's transfers were in
# flight that the step did not wait for. Per layer and micro-batch of B
# sequences, with a rank's T / cp rows, kv heads Hkv of D, f32:
#   kv = B (T / cp) Hkv D x 4 bytes
#   forward: k and v passed on cp - 1 times: 2 (cp - 1) kv
#   backward: k and v again, 2 (cp - 1) kv, and the f32 dk, dv home: 2 cp kv
# The DP reduction over dp x cp comes on top (metrics "comm"), as with data
# parallelism.
#
# Usage: bench/cp/run.sh [BUILD_DIR]   (prints a markdown table)
set -euo pipefail
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
source "$(dirname "$0")/../parallel_config.sh"
parallel_bench_setup cp "${1:-build}"
write_bench_config "$tmp/cfg.toml" "$data" 4

# The peer: the single process on every core of the machine (the ranks
# below share the same cores, one thread each).
cores=$(nproc)
OMP_NUM_THREADS=$cores "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/one" > /dev/null
one=$(/usr/bin/python3 -c '
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if "\"time_s\"" in l][1:]
print(sum(s["time_s"]["step"] for s in steps) / len(steps))' "$tmp/one")
echo "one process, $cores threads: $(/usr/bin/python3 -c "print(round(1e3 * $one))") ms a step"
echo
echo "| cp | bytes sent / step / rank (MB) | theory (MB) | ratio | overlap | exposed cp comm / step (ms) | step (ms) | step / one process's |"
echo "|---|---|---|---|---|---|---|---|"
for np in 2 4; do
  run="$tmp/cp$np"
  "${mpi[@]}" -np $np "$bin" train "$tmp/cfg.toml" --set train.run_dir="$run" --set parallel.cp=$np > /dev/null
  /usr/bin/python3 - "$run" "$np" "$one" <<'PY'
import json, sys
run, p, one = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
steps = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"comm_cp"' in l][1:]  # the first step warms up
B, T, Hkv, D, L, micro = 4, 128, 4, 64, 4, 2  # micro_batch, seq_len, kv heads, head dim, layers, micro-batches
kv = B * (T // p) * Hkv * D * 4
theory = micro * L * (2 * (p - 1) * kv + 2 * (p - 1) * kv + 2 * p * kv)
sent = sum(s["comm_cp"]["bytes"] for s in steps) / len(steps)
busy = sum(s["comm_cp"]["busy_s"] for s in steps)
exposed = sum(s["comm_cp"]["exposed_s"] for s in steps)
overlap = max(0.0, min(1.0, 1 - exposed / busy)) if busy > 0 else 1
step = sum(s["time_s"]["step"] for s in steps) / len(steps)
print(f"| {p} | {sent/1e6:.3f} | {theory/1e6:.3f} | {sent/theory:.4f} | {overlap:.2f} | {1e3*exposed/len(steps):.1f} | {1e3*step:.0f} | {step/one:.2f} |")
PY
done
