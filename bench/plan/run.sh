#!/usr/bin/env bash
# The planner (zettatron plan, plan/step_model.h) against measured runs on
# this machine: for each layout, the tokens/s `zettatron train` reaches
# (median of the steps after the first two) and the tokens/s `zettatron plan
# --cluster cpu` predicts for it, their ratio, and each run's bytes sent per
# step against the plan's (equal where the traffic does not depend on the
# routing). Layouts of 1 and 2 processes of the GPT-2 bench model
# (configs/bench.toml) and the MoE bench model (configs/bench-moe.toml).
# "calibrated": the plan with its step efficiency solved from the model's
# one-process run (`zettatron plan --calibrate RUN`), so what remains is how
# well the model predicts one layout from another.
#
# Usage: bench/plan/run.sh [steps] [BUILD_DIR]   (needs `make build`; prints a markdown table)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
build=${2:-build}
bin="$build/bin/zettatron"
tmp=$(mktemp -d /tmp/zt_bench_plan.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
test -f data/fortunes-gpt2/index.json || "$bin" prepare --config configs/data/fortunes-gpt2.toml > /dev/null
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
common=(--set train.steps=$((steps + 2)) --set train.log_every=100 --set train.eval_every=0 --set sample.count=0
        --set checkpoint.every=0)

echo "| layout | ranks | measured tokens/s | predicted | predicted / measured | calibrated / measured | bytes sent / step / rank: measured (plan) |"
echo "|---|---|---|---|---|---|---|"
# name config ranks settings...
layout() {
  local name=$1 config=$2 np=$3
  shift 3
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  local run="$tmp/$(echo "$name" | tr ' ,/' '___')"
  if [ "$np" -eq 1 ]; then
    "$bin" train "$config" "${common[@]}" "${sets[@]}" --set train.run_dir="$run" > "$run.log" 2>&1
  else
    "${mpi[@]}" -np "$np" "$bin" train "$config" "${common[@]}" "${sets[@]}" --set train.run_dir="$run" > "$run.log" 2>&1
  fi
  "$bin" plan "$config" "${sets[@]}" --cluster cpu --devices-per-node "$np" --json > "$run.plan.json"
  # The first layout of each model calibrates the others.
  [ -n "${calibration:-}" ] || calibration=$run
  "$bin" plan "$config" "${sets[@]}" --cluster cpu --devices-per-node "$np" --calibrate "$calibration" --json \
    > "$run.calibrated.json"
  /usr/bin/python3 - "$run/metrics.jsonl" "$run.plan.json" "$name" "$np" "$run.calibrated.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][2:]
plan = json.load(open(sys.argv[2]))
calibrated = json.load(open(sys.argv[5]))
measured = statistics.median(r["tokens_per_s"] for r in rows)
keys = {"dp": "comm", "tp": "comm_tp", "cp": "comm_cp", "ep": "comm_ep"}
sent = []
for dim, key in keys.items():
    got = [r[key]["bytes"] for r in rows if key in r]
    if got or plan[dim]["bytes"] > 0:
        m = statistics.median(got) if got else 0
        sent.append(f"{dim} {m / 1e6:.2f} MB ({plan[dim]['bytes'] / 1e6:.2f})")
print(f"| {sys.argv[3]} | {sys.argv[4]} | {measured:.0f} | {plan['tokens_per_s']:.0f} | "
      f"{plan['tokens_per_s'] / measured:.2f} | {calibrated['tokens_per_s'] / measured:.2f} | {', '.join(sent) or '-'} |")
PY
}

calibration=
g=configs/bench.toml
m=configs/bench-moe.toml
layout "gpt2, one process" $g 1
layout "gpt2, full recompute" $g 1 train.recompute=full
layout "gpt2 dp 2, ZeRO-0" $g 2 parallel.dp=2 train.micro_batch=4 parallel.zero_stage=0
layout "gpt2 dp 2, ZeRO-3" $g 2 parallel.dp=2 train.micro_batch=4 parallel.zero_stage=3
layout "gpt2 tp 2" $g 2 parallel.tp=2
layout "gpt2 tp 2 + sp" $g 2 parallel.tp=2 parallel.sequence_parallel=true
layout "gpt2 pp 2, 1F1B, 4 micro-batches" $g 2 parallel.pp=2 parallel.pp_schedule=1f1b train.micro_batch=2
calibration=
layout "moe, one process" $m 1
layout "moe dp 2 x ep 2" $m 2 parallel.dp=2 parallel.ep=2 train.micro_batch=4
layout "moe cp 2" $m 2 parallel.dp=1 parallel.cp=2
