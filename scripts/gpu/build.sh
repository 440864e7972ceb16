#!/usr/bin/env bash
# Run THERE (the GPU machine, repo root): unpacks the carried .debs/ into a
# private prefix (never into /), then configures and builds Zettatron with the
# CUDA backend for sm_90a into build-gpu/ - the binaries a lease runs
# (lease_targets.sh), or everything with ZT_GPU_BUILD_ALL=1. Prints the
# toolchain it found.
#   usage: bash scripts/gpu/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=/tmp/zt-prefix
if [ ! -d "$PREFIX/usr" ]; then
  mkdir -p "$PREFIX"
  for f in .debs/*.deb; do dpkg -x "$f" "$PREFIX"; done
  # dpkg -x runs no alternatives: give pkg-config an "openblas" that points at
  # the OpenMP flavour inside the prefix.
  lib="$PREFIX/usr/lib/x86_64-linux-gnu"
  mkdir -p "$lib/pkgconfig"
  cat > "$lib/pkgconfig/openblas.pc" <<PC
Name: openblas
Description: OpenBLAS (OpenMP flavour, unpacked from .deb)
Version: 0.3.21
Cflags: -I$PREFIX/usr/include/x86_64-linux-gnu/openblas-openmp
Libs: -L$lib/openblas-openmp -lopenblas
PC
fi
export PKG_CONFIG_PATH="$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig"
source scripts/gpu/env.sh
echo "gpu-build: $(nvcc --version | tail -1); $(g++ --version | head -1); $(cmake --version | head -1)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader || true
# The pack made here by scripts/gpu/prebuild.sh, while every source it was
# built from is unchanged and every library it loads is found (LD_LIBRARY_PATH
# as run.sh sets it): no compiling on device time. It unpacks with xz, or
# with Python's lzma where the machine has no xz.
unpack_lease() {
  rm -rf build-gpu && mkdir build-gpu
  if command -v xz > /dev/null; then
    tar -C build-gpu -xJf .gpu-lease/build-gpu.tar.xz
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      .gpu-lease/build-gpu.tar.xz build-gpu
  fi
}
if [ -f .gpu-lease/prebuilt.sha256 ]; then
  if ! sha256sum -c --quiet .gpu-lease/prebuilt.sha256 > build-gpu.prebuilt.log 2>&1; then
    echo "gpu-build: .gpu-lease is stale ($(grep -c FAILED build-gpu.prebuilt.log) sources changed since prebuild.sh), building here"
  elif ! unpack_lease > build-gpu.unpack.log 2>&1; then
    echo "gpu-build: .gpu-lease/build-gpu.tar.xz does not unpack: $(tail -1 build-gpu.unpack.log); building here"
    rm -rf build-gpu
  elif missing=$(ldd build-gpu/bin/zettatron build-gpu/bin/zt_cuda_tests | grep "not found" | sort -u) && [ -n "$missing" ]; then
    echo "gpu-build: .gpu-lease cannot load: $missing; building here"
    rm -rf build-gpu
  else
    ln -sfn "$(pwd -P)" /tmp/zettatron-src  # the path its ctest files name
    echo "gpu-build: ok (prebuilt here by scripts/gpu/prebuild.sh; sources match)"
    exit 0
  fi
fi
# NCCL: PyTorch's wheel (nvidia/nccl) when it is installed, else the toolkit's (NCCL_ROOT comes first).
nccl_root=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || true)
# cuDNN: PyTorch's wheel (nvidia/cudnn or the like: the folder holding include/cudnn_graph.h) when installed.
cudnn_root=$(python3 -c "
import glob, os, nvidia
hits = [h for r in nvidia.__path__ for h in glob.glob(os.path.join(r, '**', 'include', 'cudnn_graph.h'), recursive=True)]
print(os.path.dirname(os.path.dirname(hits[0])) if hits else '')" 2>/dev/null || true)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DZT_FUZZ=OFF ${nccl_root:+-DNCCL_ROOT="$nccl_root"} \
  ${cudnn_root:+-DCUDNN_ROOT="$cudnn_root"} "$@" > build-gpu.configure.log 2>&1 \
  || { cat build-gpu.configure.log; exit 1; }
grep -E "Zettatron: (CUDA|NCCL|cuDNN)" build-gpu.configure.log || true
# A failed build stops here (binaries of an earlier build would pass for it).
# Only what a lease runs (lease_targets.sh) unless ZT_GPU_BUILD_ALL=1.
source scripts/gpu/lease_targets.sh
targets=()
[ "${ZT_GPU_BUILD_ALL:-0}" = 1 ] || targets=(--target "${zt_lease_targets[@]}")
cmake --build build-gpu -j "$(nproc)" "${targets[@]}" > build-gpu.build.log 2>&1 \
  || { grep -E 'error|FAILED' build-gpu.build.log | head -50; exit 1; }
echo "gpu-build: ok"
