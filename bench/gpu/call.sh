#!/usr/bin/env bash
# One call to a lent GPU machine: run.sh's steps in order, all bounded by one
# deadline SECONDS from now (ZT_CALL_DEADLINE), so that the call's logs come
# back packed before the call's own limit (the device tool's timeout_s: give
# it SECONDS + 20). A step short of time says "skipped:" and the next one
# still gets its chance.
#   usage: bash bench/gpu/call.sh SECONDS STEP...
#   e.g.   bash bench/gpu/call.sh 570 tests "bench gpt2 llama"
# Each STEP is run.sh's arguments (what, then models). The exit status is the
# first failing step's, else 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-}
[[ $seconds =~ ^[0-9]+$ ]] && [ "$seconds" -ge 60 ] && [ "$seconds" -le 600 ] || {
  echo "call.sh: SECONDS = '${seconds}' is not a whole number from 60 to 600 (a call lasts at most 10 minutes)"
  echo "usage: bash bench/gpu/call.sh SECONDS STEP...   (e.g. 570 tests \"bench gpt2 llama\")"
  exit 2
}
shift
[ $# -gt 0 ] || { echo "call.sh: no step given (tests, bench, kernels, attention, generate, ncu, ab; then models)"; exit 2; }
for step in "$@"; do  # before anything runs: a typo would cost a run.sh's build first
  read -r -a words <<< "$step"
  [[ ${words[0]:-} =~ ^(tests|attention|kernels|generate|bench|ab|ncu|all)$ ]] \
    || { echo "call.sh: step '$step' does not start with tests, attention, kernels, generate, bench, ab, ncu or all"; exit 2; }
done
export ZT_CALL_DEADLINE=$(( $(date +%s) + seconds ))
status=0
for step in "$@"; do
  read -r -a words <<< "$step"
  echo "== run.sh ${words[*]} ($(( ZT_CALL_DEADLINE - $(date +%s) ))s of the call left)"
  bash bench/gpu/run.sh "${words[@]}"
  rc=$?
  [ $rc -eq 0 ] || [ $status -ne 0 ] || status=$rc
done
exit $status
