#!/usr/bin/env bash
# Offloading's price and its memory on this machine: the GPT-2 bench model
# (configs/bench.toml) trained on one process without offloading (the peer,
# measured in the same run), with the optimizer offloaded (optim.offload),
# with the blocks' kept activations offloaded (train.offload_activations;
# with no and with full recompute) and with both. For each: measured
# tokens/s (median of the steps after the first two) and its ratio to the
# peer's, the ratio the planner predicts (`zettatron plan --cluster cpu`,
# calibrated by the peer's run), the peaks of the device-side categories and
# of the offload category, and the activation bytes moved per step against
# the plan's. On a CPU the host is the device: offloading only moves bytes
# between categories and pays the copies - what this measures is that price
# and the planner's account of it; a GPU's saving is the offload category.
#
# Usage: bench/offload/run.sh [steps] [BUILD_DIR]   (needs `make build`; prints a markdown table)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
build=${2:-build}
bin="$build/bin/zettatron"
tmp=$(mktemp -d /tmp/zt_bench_offload.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
test -f data/fortunes-gpt2/index.json || "$bin" prepare --config configs/data/fortunes-gpt2.toml > /dev/null
config=configs/bench.toml
common=(--set train.steps=$((steps + 2)) --set train.log_every=100 --set train.eval_every=0 --set sample.count=0
        --set checkpoint.every=0)

echo "| run | tokens/s | / no offload | predicted / no offload | MiB peak: optimizer, activations, offload | activation bytes moved / step (plan) |"
echo "|---|---|---|---|---|---|"
peer=
run() {
  local name=$1
  shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  local dir="$tmp/$(echo "$name" | tr ' ,/+' '____')"
  "$bin" train "$config" "${common[@]}" "${sets[@]}" --set train.run_dir="$dir" > "$dir.log" 2>&1
  [ -n "$peer" ] || peer=$dir
  "$bin" plan "$config" "${sets[@]}" --cluster cpu --calibrate "$peer" --json > "$dir.plan.json"
  "$bin" plan "$config" --cluster cpu --calibrate "$peer" --json > "$dir.peer-plan.json"
  /usr/bin/python3 - "$dir/metrics.jsonl" "$peer/metrics.jsonl" "$dir.plan.json" "$dir.peer-plan.json" "$name" <<'PY'
import json, statistics, sys
def steps(path):
    return [json.loads(l) for l in open(path) if '"tokens_per_s"' in l][2:]
rows, peer = steps(sys.argv[1]), steps(sys.argv[2])
plan, peer_plan = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
tps = statistics.median(r["tokens_per_s"] for r in rows)
peer_tps = statistics.median(r["tokens_per_s"] for r in peer)
mib = lambda b: b / 2**20
peak = rows[-1]["peak_memory_bytes"]
moved = statistics.median(r.get("offload", {}).get("activation_bytes", 0) for r in rows)
planned = plan["offload"]["activation_bytes"] / 2  # the plan's counts both ways
print(f"| {sys.argv[5]} | {tps:.0f} | {tps / peer_tps:.3f} | {plan['tokens_per_s'] / peer_plan['tokens_per_s']:.3f} | "
      f"{mib(peak['optimizer']):.1f}, {mib(peak['activations']):.1f}, {mib(peak['offload']):.1f} | "
      f"{moved / 1e6:.1f} MB ({planned / 1e6:.1f}) |")
PY
}

run "no offload"
run "optimizer offloaded" optim.offload=true
run "activations offloaded" train.offload_activations=true
run "activations offloaded, full recompute" train.offload_activations=true train.recompute=full
run "both offloaded" optim.offload=true train.offload_activations=true
