#!/usr/bin/env bash
# The kernel bench's row filter and profiling mode on the CPU (bench/gpu/run.sh
# ncu runs them under Nsight Compute): ZT_KERNELS_ONLY times exactly the rows
# whose "model/op" its regex matches, ZT_BENCH_PROFILE=1 still prints them,
# and a bad regex or switch fails before any work, naming the variable.
#   usage: kernels_filter_test.sh ZT_BENCH_GPU_KERNELS
set -uo pipefail
bench=$1
fail() { echo "FAIL: $*"; exit 1; }
rows=$(ZT_BENCH_PROFILE=1 ZT_KERNELS_ONLY='llama3-1b/swiglu_backward$' "$bench" cpu 64) || fail "filtered run exited $?"
ops=$(grep '"op"' <<< "$rows" | sed -E 's/.*"model": "([^"]*)", "op": "([^"]*)", "shape": "([^"]*)".*/\1 \2 \3/')
expected=$'llama3-1b swiglu_backward 128x16384\nllama3-1b swiglu_backward 256x16384\nllama3-1b swiglu_backward 512x16384\nllama3-1b swiglu_backward 1024x16384'
[ "$ops" = "$expected" ] || fail $'rows other than the four swiglu_backward ones:\n'"$ops"
# Products are rows too (their candidate sweeps need a GPU).
rows=$(ZT_KERNELS_ONLY='gpt2-124m/(mlp\.in\.wgrad|cross_entropy_fused)$' "$bench" cpu 64) || fail "product run exited $?"
ops=$(grep '"op"' <<< "$rows" | sed -E 's/.*"op": "([^"]*)".*/\1/' | sort | tr '\n' ' ')
[ "$ops" = "cross_entropy_fused mlp.in.wgrad " ] || fail "expected cross_entropy_fused and mlp.in.wgrad, got: $ops"
err=$(ZT_KERNELS_ONLY='(' "$bench" cpu 64 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "ZT_KERNELS_ONLY" <<< "$err" || fail "a bad regex: exit 2 naming ZT_KERNELS_ONLY, got: $err"
err=$(ZT_BENCH_PROFILE=yes "$bench" cpu 64 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "ZT_BENCH_PROFILE" <<< "$err" || fail "a bad switch: exit 2 naming ZT_BENCH_PROFILE, got: $err"
echo "PASS"
