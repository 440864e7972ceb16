#!/usr/bin/env bash
# The op benchmarks (zt_bench_ops) as a table of ratios against this machine's
# own sgemm / memcpy rates measured in the same run, written to
# bench/results/ops-<date>.md with the machine and the commit.
# Usage: bench/run_ops.sh [benchmark_filter] [min_time_seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${1:-.}
min_time=${2:-0.3}
out_dir=bench/results
mkdir -p "$out_dir"
json=$(mktemp)
trap 'rm -f "$json"' EXIT
./build/bin/zt_bench_ops --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
  --benchmark_format=json --benchmark_out="$json" --benchmark_out_format=json > /dev/null
report="$out_dir/ops-$(date +%Y-%m-%d).md"
/usr/bin/python3 - "$json" "$report" <<'PY'
import json, platform, subprocess, sys, datetime
data = json.load(open(sys.argv[1]))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
lines = [f"# Op benchmarks, {datetime.date.today()}",
         "",
         f"Machine: {cpu}, {data['context'].get('num_cpus')} cores; commit {commit}; "
         f"threads = OMP default. `ratio` = achieved rate / peer rate measured in the same run",
         "(sgemm of the same shape, or of 2048^3 for attention; memcpy of a comparable buffer, counting read + write).",
         "",
         "| benchmark | time (ms) | GFLOP/s | GB/s | peer | ratio |",
         "|---|---:|---:|---:|---:|---:|"]
for b in data["benchmarks"]:
    if b.get("run_type") == "aggregate":
        continue
    t = b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
    f = lambda k: f"{b[k]:.1f}" if k in b else ""
    lines.append(f"| {b['name']} | {t:.3f} | {f('GFLOP/s')} | {f('GB/s')} | {f('peer')} | {b.get('ratio', 0):.2f} |")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "written: $report"
