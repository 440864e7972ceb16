#!/usr/bin/env bash
# The GPU run of issue #7, on a machine with an NVIDIA GPU (the lent H100):
# builds with the CUDA backend (scripts/gpu/build.sh, carried .debs), runs the
# GPU tests (ctest -L gpu), then the training benchmark - Zettatron against
# PyTorch (bench/gpu/pytorch_peer.py: torch.compile, flash SDPA, bf16 autocast,
# fused AdamW) on GPT-2 124M and a Llama 3 1B-shaped model, T = 1024, each at
# the largest power-of-two micro-batch that fits (2-step probes) - and
# prints a short table last (and the GPU's clock and power in each training
# run: bench/gpu/gpu_clocks.py), then where Zettatron's step goes (a short second
# run with metrics.op_profile: GPU time per op from events) and the activation
# memory `zettatron info` estimates against its peak on the GPU. `attention` times
# the CUDA attention kernels (cuDNN, and its backward with atomics; mma, flash, tensor-core gemm path, simple)
# against PyTorch's flash SDPA on the same shapes (bench/gpu/attention_bench.cpp,
# attention_peer.py). `kernels` times the step's memory-bound ops (norms, the
# fused classifier, activations, embedding, AdamW, ...) against the device's
# copy rate and PyTorch's eager kernels (bench/gpu/kernels_bench.cpp,
# kernels_peer.py), and each product with every algorithm cuBLASLt ranks for it. `generate` samples
# from GPT-2 124M with the KV cache against PyTorch's cached loop (bench/generate/run.sh cuda).
# Logs go to $OUT (or ./bench-gpu-out).
# The norms' backward in one pass and in two on its blocks write the same
# bits, so training races them per shape (backend/cuda/kernel_race.h);
# ZT_CUDA_NORM_BACKWARD=one_pass or two_pass pins one. `kernels` times both
# (<norm>_backward_one_pass, _two_pass) beside the raced <norm>_backward.
# ZT_CUDA_KERNEL_RACES=0 makes every race (the classifier's, the norms', the
# activations' launch shapes) take its first candidate: `ab`'s last setting.
# The fused classifier's kernels (backend/cuda/cross_entropy_kernels.cuh:
# the row staged in shared memory, or re-read at 1, 2 or 4 rows in flight per
# SM) write the same bits, so training races them on its first calls of each
# shape and keeps the fastest (backend/cuda/kernel_race.h);
# ZT_CUDA_CE_ROWS=1|2|4 or ZT_CUDA_CE_STAGED=1 pins one instead. `kernels`
# sweeps them (cross_entropy_fused_staged, _rows<n>; "*" the one training
# takes) and prints the race of the cross_entropy_fused row.
# ZT_CUDA_WGRAD_CHUNKS=n forces n row chunks on the weight gradients with few
# output tiles (1: one product; backend/cuda/matmul.h); `kernels` sweeps them.
# ZT_CUDA_CUBLAS_WORKSPACE_MIB=n gives each GPU n MiB of cuBLASLt workspace
# instead of 32 (split-K algorithms keep their f32 partials there); `kernels`
# sweeps each product's candidates with 256 MiB as well (MatmulWorkspaceScope).
# ZT_CUDA_MATMUL_TUNE=1 makes every product keep the fastest of cuBLASLt's
# ranked algorithms and cuBLAS's own GEMM (timed on its first call) instead
# of the heuristic's first, 0 never; unset, products tune while
# train.deterministic = false. ZT_CUDA_MATMUL_CUBLAS=1 runs the products
# without an epilogue through cuBLAS's own GEMM (cublasGemmEx, as PyTorch
# does); `kernels` times it beside each product's candidates.
# ZT_CUDA_BGRAD_EPILOGUE=1 takes GPT-2's bias gradients from the weight
# gradients' products (cuBLASLt's BGRADB epilogue) instead of a column-sum
# pass over dy; `kernels` times it (<layer>.wgrad_bgrad beside .wgrad).
# ZT_CUDA_GELU_EPILOGUE=1 runs GPT-2's GeLU inside mlp.in's product
# (cuBLASLt's GELU_AUX_BIAS epilogue writes the GeLU's input and output)
# instead of a pass of its own; `kernels` times it (mlp.in.forward_gelu
# beside .forward and gelu_forward).
# ZT_FUSED_QKV=0 runs q, k and v as three products (Llama: and RoPE in place)
# instead of one product whose heads cuDNN's attention reads in place
# (nn::qkv_form; Llama's q and k rotated in place there); ZT_FUSED_QKV=2
# splits Llama's product into q, k, v by the RoPE pass instead: the A/Bs of
# `bench` for the kernels' "q, k, v per layer" lines.
# ZT_FUSED_RESIDUAL=0 adds the blocks' residual connections in passes of
# their own (the residual norm, an add) instead of inside attn.proj's and
# mlp.out's products (nn::residual_in_products); `kernels` times
# <layer>.forward_residual beside .forward and the add.
# ZT_HEAD_CHUNK_ELEMS=n sets the LM head's logits per chunk (default 2^28 on a
# GPU): the A/B for the kernel bench's two head.wgrad rows.
# ZT_CUDA_ATTENTION=cudnn|mma|flash|gemm|simple in the environment picks the kernel
# of the training runs (backend/cuda/attention.h). `bench` trains each model
# three times: as configured (deterministic), then with the switches not yet
# on by default (ZT_BENCH_CANDIDATES), then with train.deterministic = false
# (cuDNN's attention backward sums dq with atomics, and each product keeps
# the fastest of cuBLASLt's ranked algorithms and cuBLAS's GEMM, recorded in
# a ZT_CUDA_MATMUL_PLANS file), and with ZT_BENCH_PLANS=1 a fourth,
# deterministic with that file's choices, all against the same PyTorch run (both models' first run and PyTorch's
# come before the others, which a call short of time drops).
# `attention` also times cuDNN's other engine configurations
# (ZT_CUDNN_FORWARD_CONFIG / ZT_CUDNN_BACKWARD_CONFIG, rows "cudnn f<n>", "b<n>").
# `ab` trains each model twice as configured, then under each switch in ZT_AB (the
# switches above; see the ab block below for the form). `ncu` reads Nsight
# Compute's counters of the kernel bench rows ZT_NCU_OPS names (the ncu block
# below; not part of `all`).
#   usage: bash bench/gpu/run.sh [tests|attention|kernels|generate|bench|ab|ncu|all] [gpt2|llama ...]
#   (default all, both models; `ncu` is not part of all)
# A lease has 15 minutes of device time in all, its start included, and 10
# minutes a call: run scripts/gpu/prepare_lease.sh here first (the build is
# packed, nothing compiles there); it prints what to carry and the calls,
# most wanted first (the micro-batch probes and PyTorch's compilation make one
# model's benchmark a few minutes). A call runs its steps through
# bench/gpu/call.sh SECONDS STEP..., which sets ZT_CALL_DEADLINE (epoch
# seconds): every step of every run.sh in the call starts only if it still
# fits and ends before the call does (and within its own cap, step_cap), so
# the call's logs always come back packed.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
shift || true
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(gpt2 llama)
for arch in "${models[@]}"; do  # before anything runs: a typo would cost the build first
  [[ $arch == gpt2 || $arch == llama ]] || { echo "run.sh: model '$arch' is not gpt2 or llama"; exit 2; }
done
out=$(realpath -m "${OUT:-bench-gpu-out}")
mkdir -p "$out"
# Training runs (checkpoints, final weights: hundreds of MB) stay out of $OUT;
# what comes back from a lease is at most 8 files, so on exit the logs are
# packed into one archive per call (gpu-<what>-logs.tgz; each run's
# metrics.jsonl is copied in first).
runs=/tmp/zt-bench-runs
rm -rf "$runs" && mkdir -p "$runs"  # a warm machine keeps the last call's
# A probe's answer (the largest micro-batch that fits) is kept for the later
# calls on the same warm machine (the same GPU and build), so that `ab` or
# `ncu` after `bench` starts training at once.
fits=/tmp/zt-bench-fits
mkdir -p "$fits"
pack_logs() {
  [ -n "${OUT:-}" ] || return 0  # by hand: the logs stay as they are
  for m in "$runs"/*/metrics.jsonl; do [ -f "$m" ] && cp "$m" "$out/metrics-$(basename "$(dirname "$m")").jsonl"; done
  local IFS=-
  local archive="gpu-$what-${models[*]}-logs.tgz" n=2
  # A second run of the same kind in one call (an A/B under another
  # environment) keeps the first's archive.
  while [ -e "$out/$archive" ]; do archive="gpu-$what-${models[*]}-logs-$n.tgz"; n=$((n + 1)); done
  # This call's files only: an earlier call's archive (one call runs several
  # run.sh) stays beside it, not inside.
  (cd "$out" && find . -mindepth 1 -maxdepth 1 ! -name 'gpu-*-logs*.tgz' -print0 \
     | tar czf "/tmp/$archive" --null -T - 2>/dev/null \
     && find . -mindepth 1 -maxdepth 1 ! -name 'gpu-*-logs*.tgz' -exec rm -rf {} +) \
    && mv "/tmp/$archive" "$out/"
}
# The clock sampler of the training runs (bench, ab), stopped before packing.
sampler=""
stop_sampler() {
  [ -n "$sampler" ] || return 0
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  sampler=""
}
trap 'stop_sampler; pack_logs' EXIT
# A call to the GPU machine ends at its limit (10 minutes at most), and a call
# killed there brings back loose files, not this archive. ZT_CALL_DEADLINE
# (epoch seconds, exported once at the start of a call for every run.sh in
# it) bounds each step: it starts only if about the time it needs is left,
# and runs under `timeout` until the deadline less the time packing takes.
deadline=${ZT_CALL_DEADLINE:-0}
[[ $deadline =~ ^[0-9]+$ ]] || { echo "run.sh: ZT_CALL_DEADLINE = '$deadline' is not epoch seconds (bench/gpu/call.sh sets it)"; exit 2; }
exec 3>&1  # what bounded says reaches the call's output even where the step's output goes to a log
seconds_left() {
  if [ "$deadline" -gt 0 ]; then echo $((deadline - $(date +%s) - 20)); else echo 86400; fi
}
if [ "$(seconds_left)" -le 0 ]; then  # (a deadline of "now": the call's time was given as 0)
  echo "run.sh: the call's deadline (ZT_CALL_DEADLINE=$deadline) is $((deadline - $(date +%s)))s away: nothing runs." \
    "Start a call with bash bench/gpu/call.sh SECONDS STEP..."
  exit 2
fi
# step_cap=S before a call of bounded (or of a function that calls it) caps
# that step at S seconds as well: a step that hangs (a collective, a
# compiler) loses its own time, not the rest of the call's.
step_cap=0
bounded() {  # bounded NEED_SECONDS NAME COMMAND...: 75 when skipped, 124 when cut off
  local need=$1 name=$2 left
  shift 2
  left=$(seconds_left)
  if [ "$left" -lt "$need" ]; then
    echo "skipped: $name (${left}s left in this call, it needs about ${need}s)" >&3
    return 75
  fi
  [ "$step_cap" -le 0 ] || [ "$step_cap" -ge "$left" ] || left=$step_cap
  timeout -k 5 "$left" "$@"
}
said_failed() {  # said_failed RC NAME LOG LINES: a step's failure and its log's tail (not for a skipped step)
  [ "$1" -eq 75 ] && return 0
  echo "$2 failed:"
  tail -"$4" "$3"
}
# The switches `bench` also trains each model under (environment words
# NAME=VALUE, "gpt2:" or "llama:" before one that applies to that model
# alone; empty: none): those not yet on by default, whose kernels the GPU
# tests hold against the CPU - the bias gradients from the weight gradient's
# product and the GeLU in mlp.in's (GPT-2's: Llama has neither, so it skips
# the run).
read -r -a candidates <<< "${ZT_BENCH_CANDIDATES-gpt2:ZT_CUDA_BGRAD_EPILOGUE=1 gpt2:ZT_CUDA_GELU_EPILOGUE=1}"
for word in "${candidates[@]}"; do
  [[ ${word#*:} =~ ^[A-Z_][A-Z0-9_]*=.+$ ]] && [[ $word != *:* || $word =~ ^(gpt2|llama): ]] \
    || { echo "ZT_BENCH_CANDIDATES: '$word' is not an environment setting [gpt2:|llama:]NAME=VALUE" \
              "(e.g. ZT_CUDA_MATMUL_CUBLAS=1)"; exit 2; }
done
candidates_for() {  # candidates_for ARCH: the candidate words that apply to ARCH, prefixes dropped
  local word
  for word in "${candidates[@]}"; do
    case $word in
      "$1":*) echo "${word#*:}" ;;
      *:*) ;;
      *) echo "$word" ;;
    esac
  done
}
# `ab`'s settings (below), parsed and checked before anything runs. Most
# wanted first: a call that runs out of time skips the rest.
if [ "$what" = ab ]; then
  default_settings="ZT_CUDA_MATMUL_CUBLAS=1;gpt2:ZT_CUDA_BGRAD_EPILOGUE=1;gpt2:ZT_CUDA_GELU_EPILOGUE=1"
  default_settings+=";ZT_FUSED_RESIDUAL=0"
  default_settings+=";llama:ZT_FUSED_QKV=2"
  default_settings+=";ZT_HEAD_CHUNK_ELEMS=1073741824;ZT_CUDA_CUBLAS_WORKSPACE_MIB=256;ZT_CUDA_KERNEL_RACES=0"
  IFS=';' read -r -a raw <<< "${ZT_AB:-$default_settings}"
  listed=()
  for setting in "${raw[@]}"; do  # trimmed; each word NAME=VALUE (a dot in NAME: a config key)
    read -r -a words <<< "$setting"
    [ ${#words[@]} -gt 0 ] || continue
    # One model prefix at most, on the setting's first word: it names the
    # model the whole setting runs on (the runs below read it there alone).
    unprefixed=("${words[@]}")
    case ${words[0]} in gpt2:* | llama:*) unprefixed[0]=${words[0]#*:} ;; esac
    for word in "${unprefixed[@]}"; do
      case $word in
        gpt2:* | llama:*)
          echo "ZT_AB: '$setting' names a model inside it; one model prefix, before the setting's first word (gpt2:A=1 B=2)"
          exit 2 ;;
      esac
      [[ $word =~ ^([A-Z_][A-Z0-9_]*|[a-z_]+(\.[a-z_]+)+)=.+$ ]] \
        || { echo "ZT_AB: '$word' in '$setting' is not NAME=VALUE (an environment variable or a config key)"; exit 2; }
    done
    listed+=("${words[*]}")
  done
fi
# Under the call's deadline: a pack that does not match the sources builds
# here (minutes), and a build cut off leaves build-gpu/ for the next call on
# the same warm machine to go on with, and this call's logs packed.
bounded 10 "the build" bash scripts/gpu/build.sh > "$out/build.log" 2>&1 || {
  rc=$?
  tail -60 "$out/build.log"
  [ $rc -ne 124 ] || echo "the build ran out of this call's time: a next call on this warm machine goes on with it"
  exit 1
}
tail -3 "$out/build.log"
source scripts/gpu/env.sh
if [ "$what" = tests ] || [ "$what" = all ]; then
  # All of them within ZT_GPU_TESTS_SECONDS (default 300): a test that hangs
  # (a collective waiting forever) ends there, not at the call's limit, and
  # the rest of the call (attention, kernels) still fits in its 10 minutes.
  # ZT_GPU_TESTS_JOBS (default 4) at once: most of a GPU test's time is its
  # CPU reference, and the machine has 16 cores (RUN_SERIAL tests run alone).
  budget=${ZT_GPU_TESTS_SECONDS:-300}
  left=$(seconds_left)
  [ "$left" -ge "$budget" ] || budget=$((left - 10))
  stop=$(date -d "+$budget seconds" +%H:%M:%S)
  (cd build-gpu && bounded 30 "GPU tests" ctest -L gpu -j "${ZT_GPU_TESTS_JOBS:-4}" --output-on-failure --timeout 300 \
     --stop-time "$stop" > "$out/gpu-tests.log" 2>&1)
  grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|\(Subprocess aborted\)|Timeout|Not Run|stop time" \
    "$out/gpu-tests.log" | head -40
  # Tests the stop time left unstarted are missing from ctest's count.
  listed=$(cd build-gpu && ctest -N -L gpu | sed -n 's/^Total Tests: //p')
  started=$(grep -cE "^ *[0-9]+/[0-9]+ Test +#" "$out/gpu-tests.log")
  echo "GPU tests started: $started of ${listed:-?}"
fi
[ "$what" = tests ] && exit 0
if [ "$what" = ncu ]; then
  # Hardware counters (Nsight Compute) of the kernel bench's rows that the
  # timings alone leave unexplained: one ncu process per entry of ZT_NCU_OPS
  # (';'-separated regexes over "model/op", ZT_KERNELS_ONLY of
  # kernels_bench.cpp; most wanted first), each row run once after a warmup
  # inside the profiler's capture (ZT_BENCH_PROFILE=1), so each of its
  # kernels is one run of one row. The kernel bench's ms under ncu are not
  # timings (ncu replays each kernel); ncu's duration is. Clocks as found
  # (--clock-control none). About 10-30 s an entry.
  ncu_bin=$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/nsight-compute-*/ncu \
    /usr/local/cuda*/bin/ncu 2>/dev/null | tail -1)
  if [ -z "$ncu_bin" ] || [ ! -x "$ncu_bin" ]; then
    echo "ncu: Nsight Compute is not on this machine; nothing profiled"
    exit 0
  fi
  "$ncu_bin" --version | tail -1
  # What every profile collects: the counters ncu_table.py reads.
  ncu=("$ncu_bin" --profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis
       --section Occupancy --section LaunchStats --section WarpStateStats
       --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct)
  # The default: SwiGLU's rows at 1x-8x (the backward's fall-off), the norms'
  # backward (one pass, two), the classifier (staged, R = 4), then the
  # products slower than PyTorch's (Llama's mlp.in and head input gradients)
  # and GPT-2's DGELU product: their kernels' names and SM throughput.
  ncu_default="llama3-1b/swiglu_(backward|backward_in_place|forward)$;gpt2-124m/layernorm_backward_one_pass$"
  ncu_default+=";gpt2-124m/layernorm_backward_two_pass$;llama3-1b/rmsnorm_backward_one_pass$"
  ncu_default+=";/cross_entropy_fused_(staged|rows4)"
  ncu_default+=";llama3-1b/(mlp\.in|head)\.dgrad$;gpt2-124m/mlp\.out\.dgrad_gelu$"
  IFS=';' read -r -a ncu_ops <<< "${ZT_NCU_OPS:-$ncu_default}"
  n=0 reports=()
  # profile NEED LABEL NCU_OPTION... -- COMMAND...: report n (ncu-<n>.ops names
  # it, .log its output, .csv the raw page ncu_table.py reads). A report ncu
  # wrote is exported even when the command or ncu failed after it (a bench
  # that failed a later row). No access to the counters (a container without
  # CAP_SYS_ADMIN or CAP_PERFMON on a host that keeps them for admins) ends
  # the profiling: every later entry would fail the same way.
  ncu_denied=
  profile() {
    local need=$1 label=$2 options=() rc=0
    shift 2
    while [ "$1" != -- ]; do options+=("$1"); shift; done
    shift
    n=$((n + 1))
    echo "$label" > "$out/ncu-$n.ops"
    reports+=("$out/ncu-$n.csv")
    bounded "$need" "ncu of $label" "${ncu[@]}" "${options[@]}" -f -o "$out/ncu-$n" "$@" > "$out/ncu-$n.log" 2>&1 \
      || rc=$?
    # No counters (ERR_NVGPUCTRPERM), or no profiler at all (a sandboxed GPU:
    # "Failed to initialize the profiler: LibraryNotLoaded"): every later
    # entry would fail the same way after starting the bench for nothing.
    if grep -qE "ERR_NVGPUCTRPERM|LibraryNotLoaded|Failed to initialize the profiler" "$out/ncu-$n.log"; then
      echo "ncu: cannot profile on this machine ($(grep -oE "ERR_NVGPUCTRPERM|Failed to initialize the profiler[^.]*" \
        "$out/ncu-$n.log" | head -1)); nothing more profiled"
      ncu_denied=1
      return
    fi
    [ "$rc" = 0 ] || said_failed "$rc" "ncu of $label" "$out/ncu-$n.log" 5
    [ -s "$out/ncu-$n.ncu-rep" ] || return 0
    timeout -k 5 60 "$ncu_bin" --import "$out/ncu-$n.ncu-rep" --csv --page raw > "$out/ncu-$n.csv" \
      2>> "$out/ncu-$n.log" || said_failed $? "ncu's export of $label" "$out/ncu-$n.log" 5
    # The report stays on the machine (the CSV holds what ncu_table.py
    # reads): reports of every kernel could take the archive past what a
    # call brings back.
    mv "$out/ncu-$n.ncu-rep" "$runs/"
  }
  for op in "${ncu_ops[@]}"; do
    [ -z "$ncu_denied" ] || break
    step_cap=90 ZT_BENCH_PROFILE=1 ZT_KERNELS_ONLY="$op" profile 30 "$op" -- ./build-gpu/bin/zt_bench_gpu_kernels cuda
  done
  # In training (opt-in): ZT_NCU_TRAIN = ';'-separated "arch:kernel regex[:launches]"
  # entries (e.g. "gpt2:norm_backward_fused_kernel:4;llama:swiglu_bwd_kernel:2"):
  # the first `launches` (default 4) of the matching kernels in step 3 of
  # the model's benchmark run (metrics.profiler_capture_step), at the
  # micro-batch a probe of this machine found (else 64 for GPT-2, 32 for Llama).
  IFS=';' read -r -a ncu_train <<< "${ZT_NCU_TRAIN:-}"
  for entry in "${ncu_train[@]}"; do
    [ -z "$ncu_denied" ] || break
    IFS=':' read -r arch kernels launches <<< "$entry"
    mb=$(cat "$fits/$arch"-* 2>/dev/null | head -1)
    [ -n "$mb" ] || { [ "$arch" = gpt2 ] && mb=64 || mb=32; }
    step_cap=150 profile 60 "train $arch, step 3: $kernels" -k "regex:$kernels" -c "${launches:-4}" -- \
      ./build-gpu/bin/zettatron train configs/bench-gpu-$arch.toml --set train.micro_batch=$mb \
      --set train.global_batch=$mb --set train.steps=3 --set metrics.profiler_capture_step=3 \
      --set train.run_dir="$runs/ncu-$arch"
  done
  python3 bench/gpu/ncu_table.py "${reports[@]}"
  exit 0
fi
if [ "$what" = kernels ] || [ "$what" = all ]; then
  # The step's memory-bound ops one by one against the copy rate, its products
  # against the GEMM rate (and each of cuBLASLt's ranked algorithms against its
  # first), and PyTorch's eager kernels on the same rows (about a minute).
  step_cap=240 bounded 100 "kernel bench" ./build-gpu/bin/zt_bench_gpu_kernels cuda > "$out/kernels-zt.jsonl" 2> "$out/kernels-zt.err" \
    || said_failed $? "kernels bench" "$out/kernels-zt.err" 3
  : > "$out/kernels-pt.jsonl"
  [ -s "$out/kernels-zt.jsonl" ] \
    && { step_cap=180 bounded 60 "kernel bench's PyTorch peer" python3 bench/gpu/kernels_peer.py "$out/kernels-zt.jsonl" cuda \
      > "$out/kernels-pt.jsonl" 2> "$out/kernels-pt.err" || said_failed $? "kernels peer" "$out/kernels-pt.err" 5; }
  [ -s "$out/kernels-zt.jsonl" ] && python3 - "$out/kernels-zt.jsonl" "$out/kernels-pt.jsonl" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from jsonl import json_rows
ours = json_rows(sys.argv[1])
peer = {(r["model"], r["op"], r["shape"]): r for r in json_rows(sys.argv[2])}
rate = {k: r[k] for r in ours for k in ("copy_gbps", "gemm_tflops") if k in r}
def vs_torch(r):
    p = peer.get((r["model"], r["op"], r["shape"]))
    return (f"{p['ms']:.3f}", f"{p['ms'] / r['ms']:.2f}x") if p else ("-", "-")
print(f"device copy rate (read + write): {rate.get('copy_gbps', 0):.0f} GB/s")
switches = next((r["environment"] for r in ours if r.get("environment")), "")
if switches:
    print(f"run under {switches}")
print("| model | op | shape | ms | GB/s | of copy | torch eager ms | torch / ours |")
print("|---|---|---|---|---|---|---|---|")
for r in ours:
    if "gbps" in r:
        print(f"| {r['model']} | {r['op']} | {r['shape']} | {r['ms']:.3f} | {r['gbps']:.0f} | {r['of_copy']:.0%} | "
              + " | ".join(vs_torch(r)) + " |")
races = [r for r in ours if "race" in r]
if races:
    print("\nThe races of the automatic rows (kernels that write the same bits, raced per shape of call as training "
          "does: the fastest call of each, and the choice):")
    for r in races:
        print(f"- {r['race']}")
print(f"\ndense bf16 GEMM 8192^3: {rate.get('gemm_tflops', 0):.0f} TFLOP/s")
print("| model | product | M x K x N | ms | TFLOP/s | of GEMM | torch eager ms | torch / ours "
      "| torch, f32 split-K ms |")
print("|---|---|---|---|---|---|---|---|---|")
for r in ours:
    if "tflops" in r:
        of = f"{r['of_gemm']:.0%}" if r["of_gemm"] is not None else "-"
        strict = peer.get((r["model"], r["op"], r["shape"]), {}).get("ms_strict")
        print(f"| {r['model']} | {r['op']} | {r['shape']} | {r['ms']:.3f} | {r['tflops']:.1f} | {of} | "
              + " | ".join(vs_torch(r)) + f" | {strict if strict is not None else '-'} |")
# Llama's q, k and v per layer (forward, dgrad, wgrad and the RoPE passes):
# the fused product with RoPE in place on its q and k heads (the default on
# a GPU, nn::qkv_form), with the RoPE pass splitting it (ZT_FUSED_QKV=2), and
# three products with RoPE on q and k in place (ZT_FUSED_QKV=0).
ms = {(r["model"], r["op"]): r["ms"] for r in ours if "ms" in r}
def layer_ms(model, ops):
    return sum(n * ms[(model, op)] for op, n in ops) if all((model, op) in ms for op, _ in ops) else None
passes = ("forward", "dgrad", "wgrad")
qkv_products = [(f"attn.qkv.{p}", 1) for p in passes]
in_place = layer_ms("llama3-1b", qkv_products + [("rope_packed_qkv_forward", 1), ("rope_packed_qkv_backward", 1)])
fused = layer_ms("llama3-1b", qkv_products + [("rope_split_qkv_forward", 1), ("rope_split_qkv_backward", 1)])
# rope_forward times the queries; the keys are a quarter of them (8 of 32 heads).
three = layer_ms("llama3-1b", [(f"attn.q.{p}", 1) for p in passes] + [("attn.k.forward", 2), ("attn.k.dgrad_add", 2),
                                                                       ("attn.k.wgrad", 2), ("rope_forward", 2 * 1.25)])
if in_place and fused and three:
    print(f"\nLlama's q, k, v per layer (kernel rows): fused product + RoPE in place {in_place:.3f} ms, "
          f"+ split {fused:.3f} ms ({fused / in_place:.2f}x), three products + RoPE {three:.3f} ms "
          f"({three / in_place:.2f}x)")
# GPT-2's: one product whose output cuDNN's attention reads in place (the
# default on a GPU) against three (ZT_FUSED_QKV=0), the products alone.
one = layer_ms("gpt2-124m", [(f"attn.qkv.{p}", 1) for p in passes])
three = layer_ms("gpt2-124m", [("attn.q.forward", 3), ("attn.q.dgrad", 1), ("attn.q.dgrad_add", 2),
                                ("attn.q.wgrad", 3)])
if one and three:
    print(f"GPT-2's q, k, v products per layer (kernel rows): one product {one:.3f} ms, three {three:.3f} ms "
          f"({three / one:.2f}x)")
sweeps = [r for r in ours if r.get("candidate_ms") and r["op"].endswith(".candidates")]
large = {(r["model"], r["op"].removesuffix(".candidates_large_workspace"), r["shape"]): r for r in ours
         if r.get("candidate_ms") and r["op"].endswith(".candidates_large_workspace")}
if sweeps:
    mib = next(iter(large.values()))["workspace_mib"] if large else 0
    print("\ncuBLASLt's ranked algorithms per product (MatmulCandidateScope): its first, which we use, "
          "against the fastest")
    print("and cuBLAS's own GEMM (cublasGemmEx, f32 split-K; products without an epilogue);")
    print(f"then the same with {mib} MiB of workspace (MatmulWorkspaceScope) instead of 32")
    print("| model | product | M x K x N | candidates | first ms | fastest ms | fastest | first / fastest | cuBLAS ms "
          f"| first / cuBLAS | {mib} MiB: first ms | fastest ms | cuBLAS ms | 32 MiB first / {mib} MiB fastest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    algos = []
    for r in sweeps:
        ms = r["candidate_ms"]
        best = min(range(len(ms)), key=ms.__getitem__)
        product = r["op"].removesuffix(".candidates")
        cub = r.get("cublas_ms")
        other = large.get((r["model"], product, r["shape"]), {})
        big, big_cub = other.get("candidate_ms") or [], other.get("cublas_ms")
        fastest_big = min(big + ([big_cub] if big_cub else [])) if big else None
        tail = (f"{big[0]:.3f} | {min(big):.3f} | {big_cub if big_cub else '-'} | {ms[0] / fastest_big:.2f}x"
                if big else "- | - | - | -")
        print(f"| {r['model']} | {product} | {r['shape']} | {len(ms)} | {ms[0]:.3f} | {ms[best]:.3f} | {best} | "
              f"{ms[0] / ms[best]:.2f}x | {f'{cub:.3f}' if cub else '-'} | {f'{ms[0] / cub:.2f}x' if cub else '-'} | "
              f"{tail} |")
        names = r.get("candidate_algos") or []
        if len(names) == len(ms):
            algos.append(f"| {r['model']} | {product} | {names[0]} | {names[best]} |")
    if algos:
        print("\nThe first and the fastest candidate's cuBLASLt configuration (cublasLt.h's enum values)")
        print("| model | product | first | fastest |")
        print("|---|---|---|---|")
        print("\n".join(algos))
PY
fi
[ "$what" = kernels ] && exit 0
# The benchmarks use an attention kernel only if it passes its test on this
# GPU (cuDNN, else mma, else flash, else the tensor-core gemm path, else the
# simple kernel), so one broken kernel cannot spoil a rare GPU session.
# ZT_CUDA_ATTENTION, if set, wins.
if [ -z "${ZT_CUDA_ATTENTION:-}" ]; then
  log="$out/attention-test.log"
  if ! bounded 30 "attention test" ./build-gpu/bin/zt_cuda_tests --gtest_filter='*AttentionForwardBackwardGqa*' \
      > "$log" 2>&1; then
    choice=gemm  # a crash names no path: the cuBLASLt one
    if grep -q "Failure" "$log"; then  # failure traces (": <path>" lines) name the paths that failed
      choice=""
      for k in "cudnn:cuDNN(, atomic dq .*| in batch chunks)?" "mma:mma kernel" "flash:flash kernel" \
          "gemm:tensor-core path(, chunked)?" "simple:simple kernel"; do
        [ "${k%%:*}" = cudnn ] && grep -q "refused a model shape" "$log" && continue
        if ! grep -qE ": ${k#*:}\$" "$log"; then choice=${k%%:*}; break; fi
      done
    fi
    export ZT_CUDA_ATTENTION=${choice:-simple}
    echo "ATTENTION TEST FAILED on this GPU ($log): benchmarks run with ZT_CUDA_ATTENTION=$ZT_CUDA_ATTENTION"
  fi
fi
if [ "$what" = generate ] || [ "$what" = all ]; then
  # Sampling 250 tokens from GPT-2 124M in bf16 with the KV cache (and each
  # window run again), against PyTorch's Hugging Face-style cached loop on
  # this GPU (bench/generate/run.sh cuda).
  step_cap=240 bounded 60 "generation bench" env ZT_BIN=./build-gpu/bin/zettatron bash bench/generate/run.sh 250 cuda bf16 \
    > "$out/generate.log" 2>&1 || said_failed $? "generation bench" "$out/generate.log" 30
  tail -8 "$out/generate.log"
fi
[ "$what" = generate ] && exit 0
if [ "$what" = attention ] || [ "$what" = all ]; then
  : > "$out/attention-zt.jsonl"
  # one process each: a faulting kernel spoils only its rows (cudnn-packed: q, k, v read in place from one tensor)
  for kernel in cudnn cudnn-packed cudnn-atomic mma flash tensor-core simple; do
    step_cap=60 bounded 20 "attention bench ($kernel)" ./build-gpu/bin/zt_bench_gpu_attention $kernel \
      >> "$out/attention-zt.jsonl" 2>> "$out/attention-zt.err" \
      || said_failed $? "attention bench ($kernel)" "$out/attention-zt.err" 3
  done
  grep "cuDNN cannot" "$out/attention-zt.err" | head -4
  [ -s "$out/attention-zt.jsonl" ] \
    && { step_cap=120 bounded 25 "attention bench's PyTorch peer" python3 bench/gpu/attention_peer.py > "$out/attention-pt.jsonl" \
      2> "$out/attention-pt.err" || said_failed $? "attention peer" "$out/attention-pt.err" 5; }
  # cuDNN's other engine configurations against its first choice (rows
  # "cudnn f<n>": forward configuration n; "b<n>": backward): the forward's
  # list has 4 on an H100, the backward's 2 (deterministic) and 3 (atomics).
  for n in 1 2 3; do
    ZT_CUDNN_FORWARD_CONFIG=$n step_cap=60 bounded 20 "attention bench (cuDNN forward configuration $n)" \
      ./build-gpu/bin/zt_bench_gpu_attention cudnn >> "$out/attention-zt.jsonl" 2>> "$out/attention-zt.err"
  done
  for n in 1 2; do
    for kernel in cudnn cudnn-atomic; do
      ZT_CUDNN_BACKWARD_CONFIG=$n step_cap=60 bounded 20 "attention bench ($kernel backward configuration $n)" \
        ./build-gpu/bin/zt_bench_gpu_attention $kernel >> "$out/attention-zt.jsonl" 2>> "$out/attention-zt.err"
    done
  done
  [ -s "$out/attention-zt.jsonl" ] && python3 - "$out/attention-zt.jsonl" "$out/attention-pt.jsonl" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from jsonl import json_rows
rows = [r for f in sys.argv[1:] for r in json_rows(f)]
peer = {r["shape"]: r for r in rows if r["kernel"].startswith("torch")}
print("| shape | kernel | fwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | torch fwd+bwd / ours |")
print("|---|---|---|---|---|---|")
for r in rows:
    p = peer.get(r["shape"])
    ratio = f"{p['forward_backward_ms'] / r['forward_backward_ms']:.2f}x" if p else "-"
    print(f"| {r['shape']} | {r['kernel']} | {r['forward_ms']:.3f} | {r['forward_backward_ms']:.3f} | "
          f"{r['forward_backward_tflops']:.0f} | {ratio} |")
PY
fi
[ "$what" = attention ] && exit 0
timeout 20 nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
# The GPU's clock, power, temperature and load every half second while the
# models train, and each run's window (`window NEED NAME COMMAND...`):
# bench/gpu/gpu_clocks.py says whether a run held the clock the GEMM rate was
# measured at, or a power or thermal limit pulled it down.
samples="$out/gpu-samples.csv" windows="$out/gpu-windows.txt"
: > "$windows"
(  # its own output only: it holds none of the call's
  while kill -0 $$ 2> /dev/null; do  # ends with run.sh, even one killed at the call's limit
    line=$(nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader,nounits) \
      && echo "$(date +%s.%N), $line"
    sleep 0.5
  done
) > "$samples" 2> /dev/null 3>&- < /dev/null &
sampler=$!
window() {  # window NEED NAME COMMAND...: `bounded` between two marks of the run NAME
  local need=$1 name=$2 rc
  shift 2
  echo "$(date +%s.%N) start $name" >> "$windows"
  bounded "$need" "$name" "$@"
  rc=$?
  # A skipped run has no end: gpu_clocks.py drops a start without one.
  [ $rc -eq 75 ] || echo "$(date +%s.%N) end $name" >> "$windows"
  return $rc
}
# train_run NEED LABEL ARCH MB NAME WORDS...: a timed training run of ARCH at
# micro-batch MB under `window LABEL`, into $runs/NAME (its log $out/NAME.log),
# each word NAME=VALUE an environment variable or, with a dot in the name, a
# config key given to --set; a failure's log tail is printed. Returns
# zettatron's status (75: skipped for time).
train_run() {
  local need=$1 label=$2 arch=$3 mb=$4 name=$5 envs=() sets=() word rc
  shift 5
  for word in "$@"; do
    case ${word%%=*} in *.*) sets+=(--set "$word") ;; *) envs+=("$word") ;; esac
  done
  step_cap=150 window "$need" "$label" env "${envs[@]}" ./build-gpu/bin/zettatron train configs/bench-gpu-$arch.toml \
    --set train.micro_batch=$mb --set train.global_batch=$mb --set train.run_dir="$runs/$name" "${sets[@]}" \
    > "$out/$name.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ -n "${oom_quiet:-}" ] && grep -q "out of memory" "$out/$name.log"; then
    echo "$label: micro-batch $mb does not fit ($(grep -m1 -o "[^:]*out of memory[^;.]*" "$out/$name.log" | sed 's/^ *//' | head -c 160))"
  elif [ $rc -ne 0 ]; then
    said_failed $rc "$label" "$out/$name.log" 20
  fi
  return $rc
}
clock_table() {
  stop_sampler
  [ -s "$windows" ] && python3 bench/gpu/gpu_clocks.py "$samples" "$windows"
}
# The issue's rule: the largest power-of-two micro-batch that fits. `bench`
# finds Zettatron's with its benchmark runs (below); `ab` and `ncu`, without
# one before them on this machine, by 2-step probes from the top down (an allocator "out of memory",
# or the trainer's memory plan saying the run "would run out of memory",
# means too large; any other failure stops the search); PyTorch runs the same
# micro-batch, or (if that does not fit it) its own largest, and the table
# says which. The search starts above what fits any lent GPU (GPT-2 at 256
# fits an H200's 139 GiB, 76.6 GiB on 2026-11-27; Llama at 64 too, 97.4):
# the memory plan turns a micro-batch that cannot fit away before anything is
# allocated, in a few seconds.
declare -A mb_of=([gpt2]=512 [llama]=128)  # where the search starts
declare -A trained=()
mkdir -p "$out/probes" "$runs/probes"
fit_file() {  # fit_file ARCH: where this build's largest fitting micro-batch of ARCH is kept
  echo "$fits/$1-$(sha256sum build-gpu/bin/zettatron | cut -c1-16)"
}
largest_fitting_micro_batch() {  # arch -> prints the micro-batch, or nothing
  local arch=$1 mb=${mb_of[$1]} log
  local known
  known=$(fit_file "$arch")
  if [ -s "$known" ]; then cat "$known"; return; fi
  while [ "$mb" -ge 1 ]; do
    log="$out/probes/$arch-$mb.log"
    # At most 2 minutes however much of the call is left: a probe that hangs
    # does not take the call (timeout's 124 ends the search as a failure).
    bounded 40 "$arch probe at micro-batch $mb" timeout -k 5 120 ./build-gpu/bin/zettatron train configs/bench-gpu-$arch.toml \
      --set train.micro_batch=$mb --set train.global_batch=$mb --set train.steps=2 \
      --set train.run_dir="$runs/probes/run-$arch-$mb" > "$log" 2>&1
    case $? in
      0) echo "$mb" | tee "$known"; return ;;
      75) return ;;  # no time left for it
    esac
    grep -q "out of memory" "$log" || { echo "zettatron $arch probe at micro-batch $mb failed:" >&2; tail -5 "$log" >&2; return; }
    mb=$((mb / 2))
  done
}
# `ab`: each model trained briefly (ZT_AB_STEPS steps, default 15; the median
# tokens/s after the fifth) twice as configured, then under each setting of
# ZT_AB: the drift between the first two is how far apart a setting's row must
# be to mean anything. Settings are separated by ';', each
# NAME=VALUE words: environment variables, or config keys (a dot in the name)
# given to --set; "<model>:" before the words runs the setting on that model
# only (gpt2:ZT_CUDA_BGRAD_EPILOGUE=1: Llama has no biases). Without ZT_AB:
# the switches whose default the kernel bench alone cannot settle.
if [ "$what" = ab ]; then
  # Twice as configured first: their difference is the drift a setting's row
  # must exceed, and a call short of time drops settings, not the baseline.
  runs_of=("" "" "${listed[@]}")
  for arch in "${models[@]}"; do
    mb=$(largest_fitting_micro_batch $arch)
    [ -n "$mb" ] || continue
    table="$out/ab-$arch.tsv"
    : > "$table"
    for i in "${!runs_of[@]}"; do
      setting=${runs_of[$i]}
      case $setting in
        gpt2:* | llama:*) [ "${setting%%:*}" = "$arch" ] || continue; setting=${setting#*:} ;;
      esac
      # $setting unquoted: its words are the run's settings
      train_run 35 "A/B $arch: ${setting:-as configured}" $arch $mb ab-$arch-$i \
        train.steps="${ZT_AB_STEPS:-15}" $setting
      [ $? -eq 75 ] && break
      printf '%s\t%s\n' "${setting:-as configured}" "$runs/ab-$arch-$i/metrics.jsonl" >> "$table"
    done
    python3 - "$table" "$arch" "$mb" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from train_metrics import measured
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
base = measured(rows[0][1]) if rows else None
print(f"{sys.argv[2]}, micro-batch {sys.argv[3]}: tokens/s (median after warm-up) under each setting")
print("| setting | tok/s | MFU | peak GiB | vs the first run as configured |")
print("|---|---|---|---|---|")
for setting, path in rows:
    m = measured(path)
    if m is None:
        print(f"| {setting} | failed | | | |")
        continue
    ratio = f"{m[0] / base[0] - 1:+.1%}" if base else "-"
    print(f"| {setting} | {m[0]:,.0f} | {100 * m[1]:.1f}% | {m[2]:.1f} | {ratio} |")
PY
  done
  clock_table
  exit 0
fi
# The issue's comparison first, both models (as configured, then PyTorch),
# then the runs that settle defaults: a call short of time loses those.
# The benchmark run is its own probe (no 2-step probes first: about 35 s of
# a lease): from the top down, as largest_fitting_micro_batch, a micro-batch
# the memory plan or the allocator finds too large halves; the first that
# trains is the model's, kept for later calls on this machine.
for arch in "${models[@]}"; do
  known=$(fit_file "$arch")
  mb=$(cat "$known" 2>/dev/null)
  mb=${mb:-${mb_of[$arch]}} rc=1
  while [ "$mb" -ge 1 ]; do
    rm -rf "$runs/zt-$arch"  # a refused attempt's run directory
    oom_quiet=1 train_run 45 "zettatron $arch B=$mb" $arch $mb zt-$arch
    rc=$?
    [ $rc -eq 0 ] && { echo "$mb" > "$known"; break; }
    [ $rc -ne 75 ] && grep -q "out of memory" "$out/zt-$arch.log" || break
    mb=$((mb / 2))
  done
  [ $rc -eq 0 ] || continue
  mb_of[$arch]=$mb
  trained[$arch]=1
  pt_mb=$mb
  # torch.compile and 25 steps: 50-70 s on an H200 (2026-11-27).
  while [ "$pt_mb" -ge 1 ]; do
    step_cap=240 window 90 "pytorch $arch B=$pt_mb" python3 bench/gpu/pytorch_peer.py --arch $arch --batch "$pt_mb" --seq 1024 \
      > "$out/pt-$arch.json" 2> "$out/pt-$arch.err"
    rc=$?
    case $rc in 0 | 75) break ;; esac
    grep -q "OutOfMemoryError\|out of memory" "$out/pt-$arch.err" || { said_failed $rc "pytorch $arch" "$out/pt-$arch.err" 5; break; }
    pt_mb=$((pt_mb / 2))
  done
done
# The same run with the switches not yet on by default (ZT_BENCH_CANDIDATES,
# checked above), both models before the tuning runs: what flipping their
# defaults would give the issue's comparison, in the call that measures it;
# `ab` splits it into each switch's share.
for arch in "${models[@]}"; do
  mapfile -t own < <(candidates_for "$arch")
  [ -n "${trained[$arch]:-}" ] && [ ${#own[@]} -gt 0 ] || continue
  train_run 45 "zettatron $arch, ${own[*]}" $arch ${mb_of[$arch]} zt-$arch-candidates "${own[@]}"
done
for arch in "${models[@]}"; do
  [ -n "${trained[$arch]:-}" ] || continue
  mb=${mb_of[$arch]}
  # The same run with train.deterministic = false: cuDNN's attention backward
  # sums dq with atomics (as PyTorch's flash backward does) instead of
  # keeping the score gradients in its workspace, and the products tune,
  # recording their choices (ZT_CUDA_MATMUL_PLANS); then deterministic again,
  # taking those choices: the same bits every run, with the tuned products.
  plans="$runs/matmul-plans-$arch.tsv"
  train_run 45 "zettatron $arch, deterministic = false" $arch $mb zt-$arch-atomic ZT_CUDA_MATMUL_PLANS="$plans" \
    train.deterministic=false
  [ -s "$plans" ] && cp "$plans" "$out/"
  # (opt-in, ZT_BENCH_PLANS=1: the tuned products gave +0.6% and +1.1% on
  # 2026-11-27, and a lease's 15 minutes hold the rest only just)
  if [ -s "$plans" ] && [ "${ZT_BENCH_PLANS:-0}" = 1 ]; then
    train_run 45 "zettatron $arch, tuned plans" $arch $mb zt-$arch-plans ZT_CUDA_MATMUL_PLANS="$plans"
  fi
done
for arch in "${models[@]}"; do
  [ -n "${trained[$arch]:-}" ] || continue
  python3 - "$runs/zt-$arch/metrics.jsonl" "$out/pt-$arch.json" "$arch" "${mb_of[$arch]}" \
    "$runs/zt-$arch-atomic/metrics.jsonl" "$runs/zt-$arch-plans/metrics.jsonl" \
    "$runs/zt-$arch-candidates/metrics.jsonl" "$(candidates_for "$arch" | xargs)" <<'PY'
import json, sys
sys.path.insert(0, "bench/gpu")
from train_metrics import measured
try:
    pt = json.loads(open(sys.argv[2]).read())
except Exception:
    pt = None
for label, path in (("zettatron", sys.argv[1]), (f"  {sys.argv[8]}", sys.argv[7]),
                    ("  deterministic = false", sys.argv[5]), ("  deterministic, tuned plans", sys.argv[6])):
    m = measured(path)
    if m is None:
        continue
    zt, mfu, peak = m
    line = f"{sys.argv[3]:6} B={sys.argv[4]:>3} {label} {zt:10.0f} tok/s  MFU {100 * mfu:5.1f}%  peak {peak:5.1f} GiB"
    if pt:
        line += (f" | pytorch {pt['version']} B={pt['batch']} {pt['tokens_per_s']:10.0f} tok/s  peak {pt['peak_mem_gib']:5.1f} GiB"
                 f" | ratio {zt / pt['tokens_per_s']:.2f}x")
    print(line)
PY
done
clock_table
# What the as-configured runs' kernel races chose (the trainer's last lines:
# each same-bit kernel's fastest call per shape, and the one kept).
for arch in "${models[@]}"; do
  [ -s "$out/zt-$arch.log" ] || continue
  races=$(sed -n '/^kernels raced/,/^[^ ]/p' "$out/zt-$arch.log" | grep '^  ')
  [ -z "$races" ] || { echo "$arch: kernels raced in training"; echo "$races"; }
  # (a model's bias and residual products all inside cuBLASLt: no such line)
  grep -m1 '^products whose bias or residual' "$out/zt-$arch.log" | sed "s/^/$arch: /"
  # What the plan's pre-flight check had no room for: the memory outside the
  # allocator that came after it (a reserve's size, in place of its slack).
  grep -m1 "outside this process's allocator" "$out/zt-$arch.log" | sed "s/^/$arch: /"
done
for arch in "${models[@]}"; do
  [ -n "${trained[$arch]:-}" ] || continue
  cfg=configs/bench-gpu-$arch.toml
  if step_cap=120 bounded 30 "zettatron $arch profile" ./build-gpu/bin/zettatron train $cfg --set train.run_dir="$runs/profile-$arch" \
      --set train.steps=6 --set train.micro_batch=${mb_of[$arch]} --set train.global_batch=${mb_of[$arch]} \
      --set metrics.op_profile=true > "$out/zt-$arch-profile.log" 2>&1; then
    echo "$arch: time per op (steps 2-6)"
    sed -n '/time per op/,/outside ops/p' "$out/zt-$arch-profile.log" | tail -n +2 | head -24
  else
    said_failed $? "zettatron $arch profile run" "$out/zt-$arch-profile.log" 20
  fi
  # The memory planner on the GPU: `zettatron info`'s activation estimate for
  # each recompute policy next to the allocator's peak of a step on this GPU.
  step_cap=90 bounded 20 "zettatron info $arch" ./build-gpu/bin/zettatron info configs/bench-gpu-$arch.toml \
    --set train.micro_batch=${mb_of[$arch]} --set train.global_batch=${mb_of[$arch]} > "$out/zt-$arch-info.log" 2>&1 \
    || { said_failed $? "zettatron info $arch" "$out/zt-$arch-info.log" 10; continue; }
  echo "$arch: activation memory per micro-batch of ${mb_of[$arch]}, estimated and measured on this GPU"
  sed -n '/recompute /,$p' "$out/zt-$arch-info.log"
done
