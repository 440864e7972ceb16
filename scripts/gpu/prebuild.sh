#!/usr/bin/env bash
# Run HERE (no GPU needed: CUDA 13 is installed): builds for sm_90a exactly as
# scripts/gpu/build.sh would on the GPU machine, and packs what a lease runs
# (stripped binaries, ctest's files) into .gpu-lease/build-gpu.tar.xz, so
# that a lease - 15 minutes of device time, its start included - spends none
# of them compiling (ctest -L gpu and bench/gpu/run.sh run from it). Each
# binary holds its own copy of the sm_90a kernels: 37 MiB unpacked, 3.8 MiB
# packed (2026-11-28; xz -9's 64 MiB window spans the binaries), of the
# 64 MiB a lease carries with the tree.
# CMake writes absolute paths into ctest's files, so the build is configured
# through the path /tmp/zettatron-src (a link to this checkout) and its tree
# is build-gpu/; scripts/gpu/build.sh there unpacks the pack as build-gpu/
# and points the link at the copy it runs in. .gpu-lease/prebuilt.sha256 holds
# the checksums of every file the build read: build.sh uses the pack only
# while they all match (edit a source and it builds there again).
#   usage: bash scripts/gpu/prebuild.sh        (then carry .gpu-lease)
set -euo pipefail
cd "$(dirname "$0")/../.."
link=/tmp/zettatron-src
ln -sfn "$(pwd -P)" "$link"
# The lease's binaries load its own CUDA 13, cuDNN 9 and NCCL 2 (the PyTorch
# wheels') by soname through LD_LIBRARY_PATH (bench/gpu/run.sh). Its CPU is
# not this one: host code for x86-64-v3 (AVX2, FMA), which every lent
# machine's CPU runs, instead of -march=native.
cmake -S "$link" -B "$link/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DZT_FUZZ=OFF -DZT_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 > build-gpu.configure.log 2>&1 \
  || { cat build-gpu.configure.log; exit 1; }
for need in "CUDA backend ON" "NCCL backend ON" "cuDNN ON"; do
  grep -q "Zettatron: $need" build-gpu.configure.log || { grep "Zettatron:" build-gpu.configure.log; echo "prebuild: $need is missing here"; exit 1; }
done
# The checksums of the files the build reads (sources, headers, CMake files),
# as sha256sum -c reads them, relative to the repository root - taken before
# building, so a file edited meanwhile reads as changed there.
rm -rf .gpu-lease build-gpu.pack
mkdir -p .gpu-lease build-gpu.pack/bin
git ls-files --cached --others --exclude-standard -- CMakeLists.txt '*.cmake' src tests bench \
  | grep -E '(CMakeLists\.txt|\.(cmake|c|cc|cpp|h|hpp|cu|cuh|in))$' \
  | xargs -d '\n' sha256sum > build-gpu.sha256
# A failed build stops here: binaries left from an earlier one must not be
# packed under these checksums.
source scripts/gpu/lease_targets.sh
cmake --build "$link/build-gpu" -j "$(nproc)" --target "${zt_lease_targets[@]}" > build-gpu.build.log 2>&1 \
  || { grep -E 'error|FAILED' build-gpu.build.log | head -50; exit 1; }
# What a lease runs (lease_targets.sh), without debug symbols.
for b in "${zt_lease_targets[@]}"; do cp "build-gpu/bin/$b" build-gpu.pack/bin/; done
strip --strip-unneeded build-gpu.pack/bin/*
# ctest's files: each directory's CTestTestfile.cmake and the lists of
# discovered GoogleTest cases it includes.
(cd build-gpu && find . \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' \) \
  -exec cp --parents {} ../build-gpu.pack/ \;)
tar -C build-gpu.pack -cf - . | xz -9 -T0 > .gpu-lease/build-gpu.tar.xz
echo "prebuild: packed $(du -sh build-gpu.pack | cut -f1) into $(du -sh .gpu-lease/build-gpu.tar.xz | cut -f1)"
rm -rf build-gpu.pack
mv build-gpu.sha256 .gpu-lease/prebuilt.sha256
echo "prebuild: ok ($(wc -l < .gpu-lease/prebuilt.sha256) sources checked)"
