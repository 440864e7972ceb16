#!/bin/bash
# The comm watchdog ends a job whose collective cannot complete: under
# mpirun -np 2 with a 3 s timeout, rank 1 of watchdog_probe never joins an
# all-reduce; the job must exit non-zero within 20 s, say which operation,
# group and step, and leave no process behind.
# Usage: watchdog_test.sh PROBE_BINARY
set -uo pipefail
probe=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
ZT_COMM_TIMEOUT=3 timeout 60 mpirun --oversubscribe --allow-run-as-root -np 2 -x ZT_COMM_TIMEOUT "$probe" > "$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
echo "exit status $rc after ${elapsed}s"
[ "$rc" -ne 0 ] || { echo "FAIL: the job succeeded"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung until timeout(1) killed it"; exit 1; }
[ "$elapsed" -le 20 ] || { echo "FAIL: took ${elapsed}s"; exit 1; }
grep -q "comm watchdog: all_reduce on group 'world' (world ranks 0,1; this is world rank 0) did not complete in [0-9]* s at step 17" "$out" \
  || { echo "FAIL: no watchdog message"; exit 1; }
sleep 1
if pgrep -f "^$probe" > /dev/null; then echo "FAIL: processes left behind"; pkill -9 -f "^$probe"; exit 1; fi
echo "ok"
