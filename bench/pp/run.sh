#!/bin/bash
# Pipeline bubbles per schedule, measured against the theory, and a trace.
#
# Two pipeline ranks (one core each on this 2-core machine, one thread per
# rank) train a GPT-2-shaped model of 20 blocks of d_model 256 with 8
# micro-batches per step. The LM head (V = 50257) takes as long as ~17
# blocks on this CPU (more than its FLOPs say: its matmuls stream large
# logits), so the stages are split by hand to balance time: 19 | 1 + head,
# interleaved 9 | 1 | 9 | 1 + head (every stage needs a block, so rank 1
# carries about 8 % more there). For each
# schedule: the theoretical idle share of the step ((p-1)/m of the work for
# AFAB and 1F1B, (p-1)/(v m) interleaved with v = 2, about a third of 1F1B's
# for ZB-H1) and the measured one per stage (time blocked on a neighbour's
# transfer / step time, from metrics.jsonl), mean over steps 2-6.
# Writes the Chrome trace of step 3 of each run to OUT_DIR (default
# bench/results) as pp-trace-<schedule>.json.
#
# Usage: bench/pp/run.sh [BUILD_DIR] [OUT_DIR]   (prints a markdown table)
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
bin="$build/bin/zettatron"
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
tmp=$(mktemp -d /tmp/zt_bench_pp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
data=data/fortunes-gpt2
test -f "$data/index.json" || "$bin" prepare --config configs/data/fortunes-gpt2.toml > /dev/null
cat > "$tmp/cfg.toml" <<TOML
[model]
preset = "gpt2-124m"
n_layer = 20
d_model = 256
n_head = 4
d_ff = 1024
max_seq_len = 64
[data]
dir = "$data"
tokenizer = ""
[train]
seq_len = 64
global_batch = 16
micro_batch = 2
steps = 6
log_every = 100
[sample]
count = 0
[metrics]
peak_gflops = 1
pipeline_trace_step = 3
[parallel]
pp = 2
TOML

echo "| schedule | theory: idle / step | measured idle, rank 0 | measured idle, rank 1 | compute rank 0 / rank 1 (ms, step 3) | step (ms) |"
echo "|---|---|---|---|---|---|"
for sched in afab 1f1b interleaved zb; do
  run="$tmp/$sched"
  extra=(--set parallel.pp_layers=19,1)
  [ "$sched" = interleaved ] && extra=(--set parallel.virtual_stages=2 --set parallel.pp_layers=9,1,9,1)
  "${mpi[@]}" -np 2 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$run" --set parallel.pp_schedule=$sched \
    "${extra[@]}" > /dev/null
  cp "$run/pipeline_trace.json" "$out/pp-trace-$sched.json"
  /usr/bin/python3 - "$run" "$sched" <<'PY'
import json, sys
run, sched = sys.argv[1], sys.argv[2]
steps = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"pipeline"' in l][1:]
stages = len(steps[0]["pipeline"]["bubble_per_stage"])
mean = [sum(s["pipeline"]["bubble_per_stage"][i] for s in steps) / len(steps) for i in range(stages)]
theory = steps[0]["pipeline"]["bubble_theory"]
step = sum(s["time_s"]["step"] for s in steps) / len(steps)
# Compute per rank in the traced step (forward and backward passes, not waits).
compute = [0.0] * stages
for e in json.load(open(run + "/pipeline_trace.json"))["traceEvents"]:
    if e.get("ph") == "X" and e["cat"] != "recv_wait":
        compute[e["tid"]] += e["dur"] / 1e3
print(f"| {sched} | {100*theory:.1f}% | {100*mean[0]:.1f}% | {100*mean[1]:.1f}% | {compute[0]:.0f} / {compute[1]:.0f} | {1e3*step:.0f} |")
PY
done
