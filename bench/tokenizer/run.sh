#!/usr/bin/env bash
# Tokenizer benchmark: Zettatron's GPT-2 tokenizer and `prepare` against
# tiktoken (npm, WASM build of OpenAI's Rust tokenizer) in the same run.
#
#   bash bench/tokenizer/run.sh [--save] [--corpus DIR] [--copies N] [--reps R]
#
# Prints a Markdown report; --save also writes it to
# bench/results/tokenizer-<date>.md with the date, machine and commit.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
save=0
args=()
for a in "$@"; do
  if [ "$a" = "--save" ]; then save=1; else args+=("$a"); fi
done
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target zt_bench_tokenizer >/dev/null
table=$("$BUILD_DIR/bin/zt_bench_tokenizer" "${args[@]}")
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " (with uncommitted changes)" || true)
report="# Tokenizer benchmark

Date: $(date -u +%Y-%m-%d) · commit ${commit}${dirty} · $(uname -sr) · node $(node --version)

${table}
"
echo "$report"
if [ "$save" = 1 ]; then
  out="bench/results/tokenizer-$(date -u +%Y-%m-%d).md"
  mkdir -p bench/results
  echo "$report" > "$out"
  echo "saved $out" >&2
fi
