#!/bin/bash
# Every parallel layout on GPUs against the single-GPU run, on the one GPU
# of the lent machine: several processes share it with
# parallel.comm_backend = mpi (GPU tensors staged through host memory and
# MPI; NCCL refuses a GPU twice in one communicator). 10 steps of
# llama3-tiny in f32 (seq 32, 4 micro-batches of 2 per step): the losses of
# every step must match the single-GPU run to relative 1e-5, as the CPU
# layouts match the single process.
#   dp = 2 (ZeRO-1), tp = 2 with sequence parallelism, pp = 2 (1F1B),
#   cp = 2 (ring attention: unmasked key blocks on the GPU, the merge, k and
#   v round the ring), pp = 2 x tp = 2 (zero bubble), tp = 2 x dp = 2
#   (ZeRO-3), dp = 4 in shard groups of 2 (hybrid ZeRO-2), cp = 2 x tp = 2
#   with SP, cp = 2 x dp = 2 (ZeRO-2); then GPT-2
#   (tied embeddings: the head's copy on the last stage, a vocabulary-parallel
#   tied head) at tp = 2 with SP, pp = 2, cp = 2 (learned positions: the
#   shard's rows of wpe and their gradient) and pp = 2 x tp = 2, and in f16 at
#   tp = 2 (relative 1e-2 to the one-GPU f16 run);
# and NCCL's rule: two processes on one GPU without comm_backend = mpi
# stop with a message that names the fix. On a machine with several GPUs
# the layouts that fit run over NCCL too (one GPU per process).
# Exit 77 (skipped, saying why) without a GPU, mpirun or the corpus.
# Usage: layouts_on_one_gpu_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
bin="$build/bin/zettatron"
command -v mpirun > /dev/null || { echo "SKIP: no mpirun on this machine"; exit 77; }
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
tmp=$(mktemp -d /tmp/zt_gpu_layouts.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

source "$src/tests/parallel/resume_lib.sh"
gpu_test_setup "$src" "$tmp"
gpu=(--set train.device=cuda --set train.dtype=f32 --set checkpoint.every=0)
reference() {  # reference PRESET: its config in $cfg, its one-GPU losses in $ref
  cfg="$tmp/$1.toml"
  write_config "$cfg" "$1" "$data"
  "$bin" train "$cfg" "${gpu[@]}" --set train.run_dir="$tmp/ref-$1" > "$tmp/ref-$1.log" 2>&1 \
    || { echo "FAIL: the one-GPU run of $1"; tail -20 "$tmp/ref-$1.log"; exit 1; }
  ref=$(losses "$tmp/ref-$1")
  echo "$1 on one GPU: $ref"
}
reference llama3-tiny

run() {  # run BACKEND NAME NP SETTINGS...
  local backend=$1 name=$2-$1 np=$3
  shift 3
  "${mpi[@]}" -np "$np" "$bin" train "$cfg" "${gpu[@]}" --set parallel.comm_backend=$backend \
    --set train.run_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 || { echo "FAIL: $name"; tail -20 "$tmp/$name.log"; exit 1; }
  same "$ref" "$(losses "$tmp/$name")" || { echo "FAIL: $name: losses differ from the one-GPU run"; exit 1; }
  echo "$name: losses match the one-GPU run"
}
layouts() {  # layouts BACKEND MAX_PROCESSES
  run "$1" dp2-zero1 2 --set parallel.dp=2 --set parallel.zero_stage=1
  run "$1" tp2-sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
  run "$1" pp2-1f1b 2 --set parallel.pp=2 --set parallel.pp_schedule=1f1b
  run "$1" cp2 2 --set parallel.cp=2
  [ "$2" -ge 4 ] || return 0
  run "$1" pp2-tp2-zb 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.pp_schedule=zb
  run "$1" tp2-dp2-zero3 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero_stage=3
  # Hybrid ZeRO: over NCCL each replica all-reduce queues right behind its
  # reduce-scatter on the one comm stream (DataParallel, shares_one_queue).
  run "$1" dp4-hybrid-zero2 4 --set parallel.dp=4 --set parallel.zero_stage=2 --set parallel.shard_group=2
  run "$1" cp2-tp2-sp 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
  run "$1" cp2-dp2-zero2 4 --set parallel.cp=2 --set parallel.dp=2 --set parallel.zero_stage=2
}
gpt2_layouts() {  # gpt2_layouts BACKEND MAX_PROCESSES
  run "$1" gpt2-tp2-sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
  run "$1" gpt2-pp2 2 --set parallel.pp=2
  run "$1" gpt2-cp2 2 --set parallel.cp=2
  [ "$2" -ge 4 ] || return 0
  run "$1" gpt2-pp2-tp2 4 --set parallel.pp=2 --set parallel.tp=2
}
llama=$cfg llama_ref=$ref
layouts mpi 4  # GPU tensors staged through host memory: processes share the GPU(s)
reference gpt2-tiny
gpt2_layouts mpi 4
# f16 (dynamic loss scaling) under tensor parallelism: the blocks'
# all-reduces carry f16 activations (reduced in f32, rounded to f16 at each
# step), and the run tracks the one-GPU f16 run within f16 noise.
f16=(--set train.dtype=f16)
"$bin" train "$cfg" "${gpu[@]}" "${f16[@]}" --set train.run_dir="$tmp/ref-f16" > "$tmp/ref-f16.log" 2>&1 \
  || { echo "FAIL: the one-GPU f16 run"; tail -20 "$tmp/ref-f16.log"; exit 1; }
"${mpi[@]}" -np 2 "$bin" train "$cfg" "${gpu[@]}" "${f16[@]}" --set parallel.comm_backend=mpi --set parallel.tp=2 \
  --set train.run_dir="$tmp/gpt2-tp2-f16" > "$tmp/gpt2-tp2-f16.log" 2>&1 \
  || { echo "FAIL: gpt2-tp2-f16"; tail -20 "$tmp/gpt2-tp2-f16.log"; exit 1; }
same "$(losses "$tmp/ref-f16")" "$(losses "$tmp/gpt2-tp2-f16")" 1e-2 \
  || { echo "FAIL: gpt2-tp2-f16: losses differ from the one-GPU f16 run"; exit 1; }
echo "gpt2-tp2-f16: losses track the one-GPU f16 run"
gpus=$(grep -c "cuda:[0-9]* " <<< "$("$bin" devices)" || true)
if [ "$gpus" -ge 2 ]; then
  gpt2_layouts nccl "$gpus"
  cfg=$llama ref=$llama_ref
  layouts nccl "$gpus"
  exit 0
fi
cfg=$llama

# Two processes on one GPU over NCCL (the default under mpirun): refused, naming the fix, on every rank.
if "${mpi[@]}" -np 2 "$bin" train "$cfg" "${gpu[@]}" --set train.run_dir="$tmp/nccl" --set parallel.dp=2 \
    > "$tmp/nccl.log" 2>&1; then
  echo "FAIL: two processes on one GPU over NCCL were not refused"
  exit 1
fi
grep -q "NCCL needs one GPU per process.*parallel.comm_backend = mpi" "$tmp/nccl.log" \
  || { echo "FAIL: the refusal does not name the fix:"; tail -5 "$tmp/nccl.log"; exit 1; }
echo "two processes on one GPU over NCCL: refused, naming comm_backend = mpi"
