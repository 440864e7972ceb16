#!/bin/bash
# Checkpoints across data-parallel layouts, and a rank killed mid-training,
# through `zettatron train` under mpirun.
#   1. 10 steps in one process (the reference).
#   2. 4 ranks, ZeRO-1, stopped after step 4 (checkpoint there).
#   3. that checkpoint resumed by 2 ranks with ZeRO-3 and by one process:
#      steps 5..10 match the reference (relative 1e-5: only the reduction
#      order differs).
#   4. layouts that do not fit the job fail with one message on every rank.
#   5. 2 ranks (dp = 2, then pp = 2), one failing with an error at step 3:
#      the job ends with that rank's message, not the watchdog's.
#   6. 2 ranks, one killed with SIGKILL mid-training: mpirun exits non-zero
#      well within the comm timeout and no process is left behind.
# Usage: dp_resume_test.sh BUILD_DIR
set -euo pipefail
build=$1
bin="$build/bin/zettatron"
mpi=(mpirun --oversubscribe --allow-run-as-root)
tmp=$(mktemp -d /tmp/zt_dp_resume.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

source "$(dirname "$0")/resume_lib.sh"
prepare_fortunes "$tmp/data"
write_config "$tmp/cfg.toml" gpt2-tiny "$tmp/data"

"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/ref" > /dev/null
ref=$(losses "$tmp/ref")

"${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/a" --set parallel.zero_stage=1 \
  --stop-after 4 > /dev/null
test "$(cat "$tmp/a/checkpoints/latest")" = step_00000004
grep -q '"dp": 4' "$tmp/a/checkpoints/step_00000004/manifest.json"
cp -r "$tmp/a" "$tmp/b"
cp -r "$tmp/a" "$tmp/c"

"${mpi[@]}" -np 2 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/b" --set parallel.zero_stage=3 \
  --resume > /dev/null
same "$ref" "$(losses "$tmp/b")"
echo "dp=4 ZeRO-1 -> dp=2 ZeRO-3: losses match the single-process run"

"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/c" --resume > /dev/null
same "$ref" "$(losses "$tmp/c")"
echo "dp=4 ZeRO-1 -> one process: losses match the single-process run"

# Layouts that do not fit the job: one message, from every rank, before any collective.
set +e
bad=$("${mpi[@]}" -np 3 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/bad" 2>&1)
rc=$?
set -e
test "$rc" -ne 0
# (Every rank reaches the same verdict; the first to fail ends the job, so
# the others may be stopped before they print it.)
grep -q "train.global_batch = 8 is not divisible by micro_batch x dp = 2 x 3" <<< "$bad" || { echo "$bad"; exit 1; }
set +e
bad=$("${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/bad" --set parallel.dp=2 2>&1)
rc=$?
set -e
test "$rc" -ne 0
grep -q "needs dp x tp x pp x cp = 2 processes, but the job has 4" <<< "$bad" || { echo "$bad"; exit 1; }
echo "bad layouts: one clear error on every rank"

# One rank's error mid-training (ZT_TRAIN_FAILPOINT=3 in rank 1's environment
# only: it throws at the start of step 3) ends the job with that rank's
# message, under data and under pipeline parallelism: no rank is left waiting
# for the comm watchdog (60 s), and no process stays behind.
for layout in parallel.dp=2 parallel.pp=2; do
  run=(train "$tmp/cfg.toml" --set train.run_dir="$tmp/f" --set checkpoint.every=0 --set parallel.comm_timeout=60
       --set "$layout")
  set +e
  timeout 120 "${mpi[@]}" -np 1 "$bin" "${run[@]}" : -np 1 env ZT_TRAIN_FAILPOINT=3 "$bin" "${run[@]}" \
    > "$tmp/f.out" 2>&1
  rc=$?
  set -e
  echo "$layout, rank 1 failing at step 3: exit status $rc"
  { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; } || { echo "FAIL: the job did not end with an error"; cat "$tmp/f.out"; exit 1; }
  grep -q "error: ZT_TRAIN_FAILPOINT=3: this rank fails at the start of step 3" "$tmp/f.out" \
    || { echo "FAIL: rank 1's error is not shown"; cat "$tmp/f.out"; exit 1; }
  if grep -q "comm watchdog" "$tmp/f.out"; then echo "FAIL: a rank waited for the watchdog"; cat "$tmp/f.out"; exit 1; fi
  sleep 1
  if pgrep -f "$tmp/cfg.toml" > /dev/null; then echo "FAIL: processes left behind"; exit 1; fi
done

# A rank killed mid-training.
"${mpi[@]}" -np 2 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/k" --set train.steps=100000 \
  --set checkpoint.every=0 --set parallel.comm_timeout=10 > "$tmp/k.out" 2>&1 &
launcher=$!
for _ in $(seq 1 300); do
  [ -s "$tmp/k/metrics.jsonl" ] && break
  sleep 0.1
done
victim=""
for pid in $(pgrep -f "$tmp/cfg.toml" || true); do
  if tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
done
test -n "$victim" || { echo "could not find rank 1"; kill $launcher; exit 1; }
start=$(date +%s)
kill -9 "$victim"
set +e
timeout 60 tail --pid=$launcher -f /dev/null
wait $launcher
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
echo "killed rank 1: mpirun exited with $rc after ${elapsed}s"
test "$rc" -ne 0
test "$elapsed" -le 30
# The launcher names the rank that died.
grep -E "process rank 1 .*(signal 9|Killed)" "$tmp/k.out" || { cat "$tmp/k.out"; exit 1; }
sleep 1
if pgrep -f "$tmp/cfg.toml" > /dev/null; then echo "processes left behind"; exit 1; fi
echo "ok"
