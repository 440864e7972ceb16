#!/bin/bash
# The comm watchdog ends a job that cannot go on, and leaves no process behind:
# 1. under mpirun -np 2 with a 3 s timeout, rank 1 of watchdog_probe never
#    joins an all-reduce; the job must exit non-zero within 20 s and say
#    which operation, group and step;
# 2. with the default 600 s timeout, rank 1's group reports a failure of its
#    own after 1 s (as NCCL's asynchronous errors do) while rank 0 waits;
#    the job must end within 20 s with that failure, its group and step.
# Usage: watchdog_test.sh PROBE_BINARY
set -uo pipefail
probe=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# run_probe NAME ARGS...: runs the probe under mpirun, checks it failed in time.
run_probe() {
  local name=$1
  shift
  local start rc elapsed
  start=$(date +%s)
  timeout 60 mpirun --oversubscribe --allow-run-as-root -np 2 -x ZT_COMM_TIMEOUT "$probe" "$@" > "$out" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  cat "$out"
  echo "$name: exit status $rc after ${elapsed}s"
  [ "$rc" -ne 0 ] || { echo "FAIL ($name): the job succeeded"; exit 1; }
  [ "$rc" -ne 124 ] || { echo "FAIL ($name): the job hung until timeout(1) killed it"; exit 1; }
  [ "$elapsed" -le 20 ] || { echo "FAIL ($name): took ${elapsed}s"; exit 1; }
  sleep 1
  if pgrep -f "^$probe" > /dev/null; then echo "FAIL ($name): processes left behind"; pkill -9 -f "^$probe"; exit 1; fi
}

export ZT_COMM_TIMEOUT=3
run_probe timeout
grep -q "comm watchdog: all_reduce on group 'world' (world ranks 0,1; this is world rank 0) did not complete in [0-9]* s at step 17" "$out" \
  || { echo "FAIL (timeout): no watchdog message"; exit 1; }

export ZT_COMM_TIMEOUT=600
run_probe fault fault
grep -q "comm watchdog: group 'probe-link' (world ranks 0,1; this is world rank 1) failed at step 17: the probe's link went down; aborting the job" "$out" \
  || { echo "FAIL (fault): no fault message"; exit 1; }
grep -q "did not complete" "$out" && { echo "FAIL (fault): the timeout fired, not the fault"; exit 1; }
echo "ok"
