#!/usr/bin/env bash
# Generation speed: `zettatron generate` (KV cache, and each window run
# again) vs PyTorch (Debian's 1.13, CPU; Hugging Face GPT-2's way of caching)
# on the model of configs/bench.toml, same machine, same run: one sequence,
# a 4-token prompt, 250 sampled tokens (top 40, temperature 0.8), all
# within the model's 256 positions. Prints tokens/s of each (median of 3
# runs) and the ratios.
# Usage: bench/generate/run.sh [tokens]   (needs `make build` and the demo data)
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-250}
threads=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Weights to sample from: one training step of the benchmark model.
OMP_NUM_THREADS=$threads ./build/bin/zettatron train configs/bench.toml \
  --set train.steps=1 --set train.run_dir="$out/run" --set train.log_every=100 > "$out/train.log"
# Median tokens/s of 3 runs of `zettatron generate` with the given flags.
zt_rate() {
  for run in 1 2 3; do
    OMP_NUM_THREADS=$threads ./build/bin/zettatron generate --checkpoint "$out/run" --prompt "The meaning of life" \
      --tokens "$tokens" --temperature 0.8 --top-k 40 --seed "$run" --ignore-eot "$@" 2>&1 >/dev/null |
      sed -n 's/^generated .* (\([0-9.]*\) tokens\/s.*/\1/p'
  done | sort -g | sed -n 2p
}
cached=$(zt_rate)
again=$(zt_rate --no-kv-cache)
kernels=$(./build/bin/zettatron devices | sed -n 's/^cpu: available; BLAS: OpenBLAS \([A-Za-z0-9]*\) kernels.*/\1/p')
pt=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernels} /usr/bin/python3 bench/generate/pytorch_peer.py \
  --tokens "$tokens" --threads "$threads")
/usr/bin/python3 - "$cached" "$again" "$pt" "$tokens" <<'PY'
import json, sys
cached, again, pt, tokens = float(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
print(f"model: configs/bench.toml (GPT-2 style, 6 x 384, 256 positions, vocab 50257, fp32); 4-token prompt, {tokens} tokens")
print(f"{'':34}{'tokens/s':>10}")
print(f"{'zettatron, KV cache':34}{cached:10.1f}")
print(f"{'zettatron, each window run again':34}{again:10.1f}")
print(f"{'pytorch ' + pt['version'] + ', KV cache':34}{pt['tokens_per_s']:10.1f}   ({pt['threads']} threads)")
print(f"ratio zettatron / pytorch: {cached / pt['tokens_per_s']:.2f}x")
print(f"ratio KV cache / each window again: {cached / again:.2f}x")
PY
