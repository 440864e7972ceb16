#!/usr/bin/env bash
# Offloading's price and its memory on this machine: the GPT-2 bench model
# (configs/bench.toml) trained on one process without offloading (the peer,
# measured in the same run), with the optimizer offloaded (optim.offload),
# with the blocks' kept activations offloaded (train.offload_activations;
# with no and with full recompute) and with both. For each: measured
# tokens/s (median of the steps after the first two) and its ratio to the
# peer's (the mean of the peer's runs just before and after it), the ratio the planner predicts (`zettatron plan --cluster cpu`,
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

echo "| run | tokens/s | peer tokens/s (before, after) | / peer | predicted / peer | MiB peak: optimizer, activations, offload | activation bytes moved / step (plan) |"
echo "|---|---|---|---|---|---|---|"
# A shared machine's rate drifts by tens of percent over minutes: each
# variant runs between two runs of the peer, and is compared with their mean.
n=0
train() {  # dir settings...
  local dir=$1
  shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "$bin" train "$config" "${common[@]}" "${sets[@]}" --set train.run_dir="$dir" > "$dir.log" 2>&1
  "$bin" plan "$config" "${sets[@]}" --cluster cpu --calibrate "$tmp/peer0" --json > "$dir.plan.json"
}
train "$tmp/peer0"
"$bin" plan "$config" --cluster cpu --calibrate "$tmp/peer0" --json > "$tmp/peer.plan.json"
run() {
  local name=$1
  shift
  n=$((n + 1))
  local dir="$tmp/variant$n"
  train "$dir" "$@"
  train "$tmp/peer$n"
  /usr/bin/python3 - "$dir/metrics.jsonl" "$tmp/peer$((n - 1))/metrics.jsonl" "$tmp/peer$n/metrics.jsonl" \
    "$dir.plan.json" "$tmp/peer.plan.json" "$name" <<'PY'
import json, statistics, sys
def rate(path):
    rows = [json.loads(l) for l in open(path) if '"tokens_per_s"' in l][2:]
    return rows, statistics.median(r["tokens_per_s"] for r in rows)
rows, tps = rate(sys.argv[1])
before, after = rate(sys.argv[2])[1], rate(sys.argv[3])[1]
peer = (before + after) / 2
plan, peer_plan = json.load(open(sys.argv[4])), json.load(open(sys.argv[5]))
mib = lambda b: b / 2**20
peak = rows[-1]["peak_memory_bytes"]
moved = statistics.median(r.get("offload", {}).get("activation_bytes", 0) for r in rows)
planned = plan["offload"]["activation_bytes"] / 2  # the plan counts both ways
print(f"| {sys.argv[6]} | {tps:.0f} | {before:.0f}, {after:.0f} | {tps / peer:.3f} | "
      f"{plan['tokens_per_s'] / peer_plan['tokens_per_s']:.3f} | "
      f"{mib(peak['optimizer']):.1f}, {mib(peak['activations']):.1f}, {mib(peak['offload']):.1f} | "
      f"{moved / 1e6:.1f} MB ({planned / 1e6:.1f}) |")
PY
}

run "optimizer offloaded" optim.offload=true
run "activations offloaded" train.offload_activations=true
run "activations offloaded, full recompute" train.offload_activations=true train.recompute=full
run "both offloaded" optim.offload=true train.offload_activations=true
