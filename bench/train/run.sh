#!/usr/bin/env bash
# Training throughput: Zettatron vs PyTorch (Debian's 1.13, CPU) on the same
# model, same machine, same run. Prints tokens/s of both, the ratio, and
# Zettatron's model FLOP rate against this machine's sgemm.
#   gpt2 (default)  configs/bench.toml
#   moe             configs/bench-moe.toml (mixture of experts; the peer runs
#                   Hugging Face Mixtral's expert loop)
# Usage: bench/train/run.sh [steps] [gpt2|moe]   (needs `make build` and the demo data)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-8}
model=${2:-gpt2}
case "$model" in
  gpt2) config=configs/bench.toml peer_args=() ;;
  moe) config=configs/bench-moe.toml
       peer_args=(--model moe --layers 4 --width 256 --heads 4 --kv-heads 2 --ff 512 --experts 8 --top-k 2) ;;
  *) echo "bench/train/run.sh: unknown model '$model'; valid: gpt2, moe" >&2; exit 2 ;;
esac
threads=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

OMP_NUM_THREADS=$threads ./build/bin/zettatron train "$config" \
  --set train.steps=$((steps + 2)) --set train.run_dir="$out/run" --set train.log_every=100 > "$out/zt.log"
# Median over the steps after the first two (allocation and warm-up).
zt=$(/usr/bin/python3 - "$out/run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][2:]
print(json.dumps({"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                  "mfu": statistics.median(r["mfu"] for r in rows)}))
PY
)
# The peer's products run the same OpenBLAS kernels as ours: the ones
# Zettatron chose for this CPU (backend/cpu/blas_kernels.h), which PyTorch's
# process, loading the same library, would not otherwise get.
kernels=$(./build/bin/zettatron devices | sed -n 's/^cpu: available; BLAS: OpenBLAS \([A-Za-z0-9]*\) kernels.*/\1/p')
pt=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernels} /usr/bin/python3 bench/train/pytorch_peer.py --steps "$steps" --threads "$threads" "${peer_args[@]}")
peak=$(grep -o "MFU peak [0-9.]* GFLOP/s" "$out/zt.log" | awk '{print $3}')
/usr/bin/python3 - "$zt" "$pt" "$peak" "${OPENBLAS_CORETYPE:-$kernels}" "$model" <<'PY'
import json, sys
zt, pt, peak = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
ratio = zt["tokens_per_s"] / pt["tokens_per_s"]
if sys.argv[5] == "moe":
    print("model: configs/bench-moe.toml (Llama MoE, 4 x 256, 8 experts of 512, top 2, T=256, B=8, vocab 50257, fp32)")
else:
    print("model: configs/bench.toml (GPT-2 style, 6 x 384, T=256, B=8, vocab 50257, fp32)")
print(f"{'':24}{'tokens/s':>12}")
print(f"{'zettatron':24}{zt['tokens_per_s']:12.0f}")
print(f"{'pytorch ' + pt['version']:24}{pt['tokens_per_s']:12.0f}   ({pt['threads']} threads)")
print(f"OpenBLAS kernels (both): {sys.argv[4]}")
print(f"ratio zettatron / pytorch: {ratio:.2f}x")
print(f"zettatron MFU (6N + 12 L d T, N incl. LM head (MoE: active), over sgemm {peak:.0f} GFLOP/s): {100 * zt['mfu']:.1f}%")
PY
