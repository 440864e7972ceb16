#!/usr/bin/env bash
# A GPU call's arguments are refused before anything runs (bench/gpu/call.sh,
# bench/gpu/run.sh): a time outside 60-600 s, an unknown step, no step, and a
# deadline already passed (the "now" of a time given as 0), an A/B setting
# with a misplaced model prefix - each with exit
# status 2 and a message that names the problem, never a build started or
# every step skipped in silence. No GPU needed.
#   usage: call_args_test.sh SOURCE_DIR
set -uo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect() {  # expect PATTERN COMMAND...: exit 2 and PATTERN in its output
  local pattern=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] && grep -q -- "$pattern" <<< "$out" || fail "$*: wanted exit 2 and '$pattern', got $rc: $out"
}
expect "not a whole number from 60 to 600" bash "$src/bench/gpu/call.sh" 0 tests
expect "not a whole number from 60 to 600" bash "$src/bench/gpu/call.sh" 601 tests
expect "not a whole number from 60 to 600" bash "$src/bench/gpu/call.sh" D tests
expect "step 'bogus gpt2' does not start with" bash "$src/bench/gpu/call.sh" 100 tests "bogus gpt2"
expect "no step given" bash "$src/bench/gpu/call.sh" 100
expect "nothing runs" env OUT="$tmp/out" ZT_CALL_DEADLINE="$(date +%s)" bash "$src/bench/gpu/run.sh" tests
expect "is not epoch seconds" env OUT="$tmp/out" ZT_CALL_DEADLINE=soon bash "$src/bench/gpu/run.sh" tests
# ZT_AB: a model prefix anywhere but before a setting's first word would skip
# the setting on both models in silence.
later=$(( $(date +%s) + 3600 ))
expect "names a model inside it" env OUT="$tmp/out" ZT_CALL_DEADLINE=$later ZT_AB="ZT_A=1 gpt2:ZT_B=1" \
  bash "$src/bench/gpu/run.sh" ab
expect "names a model inside it" env OUT="$tmp/out" ZT_CALL_DEADLINE=$later ZT_AB="gpt2:llama:ZT_B=1" \
  bash "$src/bench/gpu/run.sh" ab
expect "is not NAME=VALUE" env OUT="$tmp/out" ZT_CALL_DEADLINE=$later ZT_AB="llama:ZT_B" bash "$src/bench/gpu/run.sh" ab
# The generation bench refuses a device or dtype it has no peer for before it trains.
expect "unknown device 'gpu'; valid: cpu, cuda" bash "$src/bench/generate/run.sh" 10 gpu
expect "dtype 'f16' is not f32 or bf16" bash "$src/bench/generate/run.sh" 10 cpu f16
# (run.sh packs its logs into an archive on exit: the build's would be in it)
for archive in "$tmp"/out/*.tgz; do
  [ -e "$archive" ] || continue
  ! tar tzf "$archive" | grep -q 'build\.log' || fail "run.sh started the build under a passed deadline"
done
echo "PASS"
