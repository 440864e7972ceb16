#!/bin/bash
# Pipeline bubbles per schedule, measured against the theory, and a trace.
#
# Two pipeline ranks (one core each on this 2-core machine, one thread per
# rank), 8 micro-batches of 2 x 64 tokens per step, f32, two models:
#
#   balanced  GPT-2 family, 8 blocks of d_model 512 (d_ff 2048), a
#             byte-level vocabulary (256 bytes + 256 special tokens: the data
#             is prepared here with a 256-line tiktoken rank file), so the
#             embedding and the LM head cost little (the head ~8 % of a
#             block) and the stages split by the planner (4 | 4; interleaved
#             2 | 2 | 2 | 2) take equal time. The model the theory describes.
#   gpt2-vocab  20 blocks of d_model 256 with GPT-2's 50257-token vocabulary:
#             the LM head (3 V x C matmuls per token, split forward : backward
#             : weight like a block's) is as long as ~17 blocks on this CPU,
#             so no split into stages of whole blocks is even; split by hand
#             for time: 19 | 1 + head, interleaved 9 | 1 | 9 | 1 + head.
#
# For each schedule: the theoretical idle share of the step ((p-1)/m of the
# work for AFAB and 1F1B, (p-1)/(v m) interleaved with v = 2, ZB-H1's from the
# schedule simulator; ZB-H1's also at the F, B, W pass times this run
# measured, since its bubble depends on them) and the measured one per stage (1 - the stage's compute /
# the schedule's span, the longest rank's; from metrics.jsonl), median over
# steps 2-10; and the time blocked on a neighbour's transfer, the part of it spent
# waiting inside the schedule (the rest is before the rank's first pass or
# after its last).
# Writes the Chrome trace of step 3 of the balanced model's 1F1B and ZB runs
# to OUT_DIR (default bench/results) as pp-trace-<schedule>.json.
#
# Usage: bench/pp/run.sh [BUILD_DIR] [OUT_DIR]   (prints two markdown tables)
set -euo pipefail
build=${1:-build}
out=${2:-bench/results}
bin="$build/bin/zettatron"
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
tmp=$(mktemp -d /tmp/zt_bench_pp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The byte-level dataset: the demo corpus, one token per byte.
/usr/bin/python3 -c '
import base64
for b in range(256): print(base64.b64encode(bytes([b])).decode(), b)' > "$tmp/bytes.tiktoken"
"$bin" prepare --tokenizer "$tmp/bytes.tiktoken" --input /usr/share/games/fortunes --doc-split percent \
  --output "$tmp/data-bytes" --quiet > /dev/null
gpt2_data=data/fortunes-gpt2
test -f "$gpt2_data/index.json" || "$bin" prepare --config configs/data/fortunes-gpt2.toml > /dev/null

# write_config FILE DATA_DIR N_LAYER VOCAB D_MODEL
write_config() {
  cat > "$1" <<TOML
[model]
preset = "gpt2-124m"
n_layer = $3
d_model = $5
n_head = $(($5 / 64))
d_ff = $((4 * $5))
max_seq_len = 64
vocab_size = $4
[data]
dir = "$2"
tokenizer = ""
[train]
seq_len = 64
global_batch = 16
micro_batch = 2
steps = 10
log_every = 100
[sample]
count = 0
[metrics]
peak_gflops = 1
pipeline_trace_step = 3
[parallel]
pp = 2
TOML
}

# measure NAME CONFIG SPLIT INTERLEAVED_SPLIT TRACE_SCHEDULES: one table row per schedule.
measure() {
  local name=$1 cfg=$2 split=$3 isplit=$4 traces=$5
  echo
  echo "Model: $name"
  echo
  echo "| schedule | theory: idle / span | measured idle / span, rank 0 / rank 1 | of which blocked on a transfer, rank 0 / rank 1 | compute rank 0 / rank 1 (ms, step 3) | step (ms) |"
  echo "|---|---|---|---|---|---|"
  for sched in afab 1f1b interleaved zb; do
    local run="$tmp/$name-$sched" extra=()
    [ -n "$split" ] && extra=(--set parallel.pp_layers=$split)
    if [ "$sched" = interleaved ]; then
      extra=(--set parallel.virtual_stages=2)
      [ -n "$isplit" ] && extra+=(--set parallel.pp_layers=$isplit)
    fi
    "${mpi[@]}" -np 2 "$bin" train "$cfg" --set train.run_dir="$run" --set parallel.pp_schedule=$sched \
      "${extra[@]}" > /dev/null
    case " $traces " in *" $sched "*) cp "$run/pipeline_trace.json" "$out/pp-trace-$sched.json" ;; esac
    /usr/bin/python3 - "$run" "$sched" <<'PY'
import json, sys
run, sched = sys.argv[1], sys.argv[2]
steps = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"pipeline"' in l][1:]
stages = len(steps[0]["pipeline"]["bubble_per_stage"])
# Medians over the steps: a step slowed by the machine (2 shared cores) does not move them.
median = lambda xs: sorted(xs)[len(xs) // 2]
mean = [median([s["pipeline"]["bubble_per_stage"][i] for s in steps]) for i in range(stages)]
wait = [median([s["pipeline"]["p2p_wait_per_stage"][i] for s in steps]) for i in range(stages)]
theory = steps[0]["pipeline"]["bubble_theory"]
step = median([s["time_s"]["step"] for s in steps])
# Compute per rank in the traced step (forward and backward passes, not waits).
compute = [0.0] * stages
for e in json.load(open(run + "/pipeline_trace.json"))["traceEvents"]:
    if e.get("ph") == "X" and e["cat"] != "recv_wait":
        compute[e["tid"]] += e["dur"] / 1e3
if sched == "zb":
    # ZB-H1's theory at this run's pass times: idle (p-1)(F + B - W) per m (F + B + W) of work.
    t = {}
    for e in json.load(open(run + "/pipeline_trace.json"))["traceEvents"]:
        if e.get("ph") == "X":
            t.setdefault(e["cat"], []).append(e["dur"])
    F, B, W = (sum(t[k]) / len(t[k]) for k in ("forward", "backward_input", "backward_weight"))
    b = (stages - 1) * (F + B - W) / (len(t["forward"]) / stages * (F + B + W))
    theory_text = f"{100*theory:.1f}% (at this run's F : B : W = 1 : {B/F:.2f} : {W/F:.2f}: {100*b/(1+b):.1f}%)"
else:
    theory_text = f"{100*theory:.1f}%"
print(f"| {sched} | {theory_text} | {100*mean[0]:.1f}% / {100*mean[1]:.1f}% | {100*wait[0]:.1f}% / {100*wait[1]:.1f}% "
      f"| {compute[0]:.0f} / {compute[1]:.0f} | {1e3*step:.0f} |")
PY
  done
}

write_config "$tmp/balanced.toml" "$tmp/data-bytes" 8 512 512
write_config "$tmp/gpt2-vocab.toml" "$gpt2_data" 20 50257 256
measure balanced "$tmp/balanced.toml" "" "" "1f1b zb"
measure gpt2-vocab "$tmp/gpt2-vocab.toml" 19,1 9,1,9,1 ""
