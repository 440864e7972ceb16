#!/bin/bash
# Checkpoints across tensor-, pipeline- and context-parallel sizes, through `zettatron train` under
# mpirun (Llama 3 tiny: 2 kv heads, so tp = 4 replicates them; untied head).
#   1. 10 steps in one process (the reference, and its final weights).
#   2. tp = 2 with sequence parallelism, stopped after step 4 (checkpoint:
#      every rank writes its slices as boxes of the global tensors).
#   3. that checkpoint resumed by one process (tp = 1), by tp = 4 and by
#      tp = 2 x dp = 2 with ZeRO-1: steps 5..10 match the reference
#      (relative 1e-5), and the final model.safetensors of the tp = 4 run
#      (assembled from the slices) matches the reference's weights (per
#      layer, 1e-5).
#   4. a checkpoint written by tp = 2 x dp = 2 ZeRO-1 resumed by one process.
#   5. saved at pp = 2, resumed by one process, by pp = 2 x tp = 2 (zero
#      bubble) and by pp = 2 x dp = 2 with ZeRO-3, whose final
#      model.safetensors match the reference too; both print their samples.
#   6. saved at cp = 2 with ZeRO-1, resumed by one process and by cp = 2 x
#      tp = 2 (its final model.safetensors matches the reference too).
#   7. a mixture-of-experts model (llama3-moe-tiny, 4 experts): saved at
#      dp = 2 x ep = 2 with ZeRO-1 (each ep rank writes its experts), resumed
#      by one process and by dp = 4 x ep = 4 with ZeRO-3 (its final
#      model.safetensors matches the MoE reference); saved at tp = 2 (SP) x
#      dp = 2 with ep = 2 (experts split both ways), resumed by one process
#      and by tp = 4 (whose final model.safetensors matches too).
# Usage: model_parallel_resume_test.sh BUILD_DIR
set -euo pipefail
build=$1
bin="$build/bin/zettatron"
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
tmp=$(mktemp -d /tmp/zt_tp_resume.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

source "$(dirname "$0")/resume_lib.sh"
prepare_fortunes "$tmp/data"
write_config "$tmp/cfg.toml" llama3-tiny "$tmp/data"

"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/ref" > /dev/null
ref=$(losses "$tmp/ref")

"${mpi[@]}" -np 2 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/a" --set parallel.tp=2 \
  --set parallel.sequence_parallel=true --stop-after 4 > /dev/null
test "$(cat "$tmp/a/checkpoints/latest")" = step_00000004
grep -q '"tp": 2' "$tmp/a/checkpoints/step_00000004/manifest.json"
ls "$tmp/a/checkpoints/step_00000004" | grep -q "shard-00001.safetensors"
for d in b c e; do cp -r "$tmp/a" "$tmp/$d"; done

"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/b" --resume > /dev/null
same "$ref" "$(losses "$tmp/b")"
echo "tp=2 (SP) -> one process: losses match the single-process run"

"${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/c" --set parallel.tp=4 --resume > /dev/null
same "$ref" "$(losses "$tmp/c")"
echo "tp=2 (SP) -> tp=4: losses match the single-process run"

"${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/e" --set parallel.tp=2 \
  --set parallel.zero_stage=1 --resume > /dev/null
same "$ref" "$(losses "$tmp/e")"
echo "tp=2 (SP) -> tp=2 x dp=2 ZeRO-1: losses match the single-process run"

# A checkpoint written by tp=2 x dp=2 ZeRO-1 (tensor slices and optimizer shards) read by one process.
cp -r "$tmp/e" "$tmp/f"
rm -rf "$tmp/f/checkpoints/step_00000008" "$tmp/f/checkpoints/step_00000010"
grep -q '"tp": 2' "$tmp/f/checkpoints/step_00000006/manifest.json"
grep -q '"dp": 2' "$tmp/f/checkpoints/step_00000006/manifest.json"
"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/f" --resume "$tmp/f/checkpoints/step_00000006" > /dev/null
same "$ref" "$(losses "$tmp/f")"
echo "tp=2 x dp=2 ZeRO-1 -> one process: losses match the single-process run"

# Pipeline: saved at pp=2 (1F1B: each stage writes its blocks), resumed by one process and by
# pp=2 x tp=2 with the zero-bubble schedule; that run's final model.safetensors gathers stages and slices.
"${mpi[@]}" -np 2 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/g" --set parallel.pp=2 --stop-after 4 > /dev/null
grep -q '"pp": 2' "$tmp/g/checkpoints/step_00000004/manifest.json"
for d in h i; do cp -r "$tmp/g" "$tmp/$d"; done
"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/h" --resume > /dev/null
same "$ref" "$(losses "$tmp/h")"
echo "pp=2 -> one process: losses match the single-process run"
# These two also draw samples at the end (every rank of the pipeline runs its stages per token).
samples=(--set data.tokenizer=gpt2 --set sample.count=2 --set sample.tokens=8)
"${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/i" --set parallel.pp=2 --set parallel.tp=2 \
  --set parallel.pp_schedule=zb --resume "${samples[@]}" > "$tmp/i.log"
same "$ref" "$(losses "$tmp/i")"
echo "pp=2 -> pp=2 x tp=2 (zero bubble): losses match the single-process run"
cp -r "$tmp/g" "$tmp/j"
"${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/j" --set parallel.pp=2 \
  --set parallel.zero_stage=3 --resume "${samples[@]}" > "$tmp/j.log"
same "$ref" "$(losses "$tmp/j")"
echo "pp=2 -> pp=2 x dp=2 ZeRO-3: losses match the single-process run"
for run in i j; do
  test "$(grep -c '^sample (step 10): .' "$tmp/$run.log")" = 2 || { echo "FAIL: run $run printed no samples"; cat "$tmp/$run.log"; exit 1; }
done
echo "samples drawn under pp=2 x tp=2 and pp=2 x dp=2 ZeRO-3"

# Context parallelism: saved at cp=2 with ZeRO-1 (shards over dp x cp), resumed by one process
# and by cp=2 x tp=2 (whose final model.safetensors is checked below too).
"${mpi[@]}" -np 2 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/k" --set parallel.cp=2 \
  --set parallel.zero_stage=1 --stop-after 4 > /dev/null
grep -q '"cp": 2' "$tmp/k/checkpoints/step_00000004/manifest.json"
grep -q '"dp": 1' "$tmp/k/checkpoints/step_00000004/manifest.json"
for d in l m; do cp -r "$tmp/k" "$tmp/$d"; done
"$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/l" --resume > /dev/null
same "$ref" "$(losses "$tmp/l")"
echo "cp=2 ZeRO-1 -> one process: losses match the single-process run"
"${mpi[@]}" -np 4 "$bin" train "$tmp/cfg.toml" --set train.run_dir="$tmp/m" --set parallel.cp=2 --set parallel.tp=2 \
  --resume > /dev/null
same "$ref" "$(losses "$tmp/m")"
echo "cp=2 ZeRO-1 -> cp=2 x tp=2: losses match the single-process run"

# Expert parallelism: a mixture-of-experts model saved at dp=2 x ep=2 (each ep rank's experts
# are slices of the stacked expert tensors), resumed by one process and by dp=4 x ep=4 ZeRO-3.
write_config "$tmp/moe.toml" llama3-moe-tiny "$tmp/data"
"$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/moeref" > /dev/null
moeref=$(losses "$tmp/moeref")
"${mpi[@]}" -np 2 "$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/n" --set parallel.ep=2 \
  --set parallel.zero_stage=1 --stop-after 4 > /dev/null
for d in o p; do cp -r "$tmp/n" "$tmp/$d"; done
"$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/o" --resume > /dev/null
same "$moeref" "$(losses "$tmp/o")"
echo "MoE dp=2 x ep=2 ZeRO-1 -> one process: losses match the single-process run"
"${mpi[@]}" -np 4 "$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/p" --set parallel.ep=4 \
  --set parallel.zero_stage=3 --resume > /dev/null
same "$moeref" "$(losses "$tmp/p")"
echo "MoE dp=2 x ep=2 ZeRO-1 -> dp=4 x ep=4 ZeRO-3: losses match the single-process run"
# Experts split both ways: saved at tp=2 (SP) x dp=2 with ep=2 and ZeRO-1 (each rank writes its
# experts' hidden columns, boxes per expert), resumed by one process and by tp=4.
"${mpi[@]}" -np 4 "$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/q" --set parallel.tp=2 \
  --set parallel.sequence_parallel=true --set parallel.ep=2 --set parallel.zero_stage=1 --stop-after 4 > /dev/null
grep -q '"tp": 2' "$tmp/q/checkpoints/step_00000004/manifest.json"
for d in r s; do cp -r "$tmp/q" "$tmp/$d"; done
"$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/r" --resume > /dev/null
same "$moeref" "$(losses "$tmp/r")"
echo "MoE tp=2 (SP) x dp=2, ep=2 -> one process: losses match the single-process run"
"${mpi[@]}" -np 4 "$bin" train "$tmp/moe.toml" --set train.run_dir="$tmp/s" --set parallel.tp=4 --resume > /dev/null
same "$moeref" "$(losses "$tmp/s")"
echo "MoE tp=2 (SP) x dp=2, ep=2 -> tp=4: losses match the single-process run"

# The final weights of the tp=4 run, of the pp x tp run, of the cp x tp run, of the ep=4 and of the MoE tp=4
# run, assembled from slices and stages, against their references.
for run in c i j m p s; do
reference="$tmp/ref/model.safetensors"
if [ "$run" = p ] || [ "$run" = s ]; then reference="$tmp/moeref/model.safetensors"; fi
/usr/bin/python3 - "$reference" "$tmp/$run/model.safetensors" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e["dtype"]
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(e["shape"]).astype(np.float64)
    return out
# Per layer (as the layout tests compare them: tests/parallel/parallel_test_util.h
# layer_rel_diffs): a resharding bug moves whole slices; rounding alone moves one
# tensor, layers.1.mlp.out.weight, by up to 1.6e-5 (tp_test's noise floors).
ref, got = load(sys.argv[1]), load(sys.argv[2])
assert ref.keys() == got.keys(), (sorted(ref), sorted(got))
acc = {}
for name in ref:
    assert ref[name].shape == got[name].shape, (name, ref[name].shape, got[name].shape)
    layer = ".".join(name.split(".")[:2]) if name.startswith("layers.") else "embed" if name.startswith("embed.") else "head"
    d, r = acc.get(layer, (0.0, 0.0))
    acc[layer] = (d + np.sum((got[name] - ref[name]) ** 2), r + np.sum(ref[name] ** 2))
for layer, (d, r) in acc.items():
    rel = np.sqrt(d / max(r, 1e-30))
    assert rel < 1e-5, f"{layer}: relative difference {rel}"
print(f"final weights of {sys.argv[2]} match the reference ({len(ref)} tensors)")
PY
done
echo "ok"
