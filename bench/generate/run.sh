#!/usr/bin/env bash
# Generation speed: `zettatron generate` (KV cache, and each window run
# again) vs PyTorch (Hugging Face GPT-2's way of caching:
# bench/generate/pytorch_peer.py) on the same model shape, same machine, same
# run: one sequence, a 4-token prompt, TOKENS sampled tokens (top 40,
# temperature 0.8), all within the model's positions. Prints tokens/s of
# each (median of 3 runs) and the ratios.
#   cpu (default)  configs/bench.toml (6 x 384, 256 positions), PyTorch 1.13 (Debian, CPU)
#   cuda           configs/bench-gpu-gpt2.toml (GPT-2 124M, 1024 positions), PyTorch on the GPU
# DTYPE f32 (default on the CPU) or bf16 (default on a GPU).
# Usage: bench/generate/run.sh [TOKENS] [cpu|cuda] [f32|bf16]   (needs `make build` and the demo data;
# ZT_BIN: the zettatron binary, default ./build/bin/zettatron - build-gpu's on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-250}
device=${2:-cpu}
case "$device" in
  cpu) config=configs/bench.toml dtype=${3:-f32} python=/usr/bin/python3 peer_args=() ;;
  cuda) config=configs/bench-gpu-gpt2.toml dtype=${3:-bf16} python=python3
        peer_args=(--layers 12 --width 768 --heads 12 --seq 1024 --device cuda) ;;
  *) echo "bench/generate/run.sh: unknown device '$device'; valid: cpu, cuda" >&2; exit 2 ;;
esac
[[ $dtype == f32 || $dtype == bf16 ]] || { echo "bench/generate/run.sh: dtype '$dtype' is not f32 or bf16" >&2; exit 2; }
bin=${ZT_BIN:-./build/bin/zettatron}
threads=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Weights to sample from: one training step of the benchmark model (one
# short sequence: the weights are what matters, not the step).
OMP_NUM_THREADS=$threads "$bin" train "$config" --set train.device="$device" --set train.dtype="$dtype" \
  --set train.steps=1 --set train.seq_len=64 --set train.global_batch=1 --set train.micro_batch=1 \
  --set train.run_dir="$out/run" --set train.log_every=100 --set sample.count=0 > "$out/train.log" 2>&1 \
  || { tail -20 "$out/train.log"; exit 1; }
# Median tokens/s of 3 runs of `zettatron generate` with the given flags.
zt_rate() {
  for run in 1 2 3; do
    OMP_NUM_THREADS=$threads "$bin" generate --checkpoint "$out/run" --device "$device" \
      --prompt "The meaning of life" --tokens "$tokens" --temperature 0.8 --top-k 40 --seed "$run" --ignore-eot "$@" \
      2>&1 >/dev/null | sed -n 's/^generated .* (\([0-9.]*\) tokens\/s.*/\1/p'
  done | sort -g | sed -n 2p
}
cached=$(zt_rate)
again=$(zt_rate --no-kv-cache)
kernels=$("$bin" devices | sed -n 's/^cpu: available; BLAS: OpenBLAS \([A-Za-z0-9]*\) kernels.*/\1/p')
pt=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernels} $python bench/generate/pytorch_peer.py \
  --tokens "$tokens" --threads "$threads" --dtype "$dtype" "${peer_args[@]}")
/usr/bin/python3 - "$cached" "$again" "$pt" "$tokens" "$config" "$device" "$dtype" <<'PY'
import json, sys
cached, again, pt = float(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
tokens, config, device, dtype = sys.argv[4:8]
print(f"model: {config} on {device} in {dtype}; 4-token prompt, {tokens} tokens")
print(f"{'':34}{'tokens/s':>10}")
print(f"{'zettatron, KV cache':34}{cached:10.1f}")
print(f"{'zettatron, each window run again':34}{again:10.1f}")
where = f"({pt['threads']} threads)" if device == "cpu" else ""
print(f"{'pytorch ' + pt['version'] + ', KV cache':34}{pt['tokens_per_s']:10.1f}   {where}")
print(f"ratio zettatron / pytorch: {cached / pt['tokens_per_s']:.2f}x")
print(f"ratio KV cache / each window again: {cached / again:.2f}x")
PY
