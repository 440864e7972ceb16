# Sourced by scripts/gpu/prebuild.sh (here) and scripts/gpu/build.sh (there):
# the binaries a GPU lease runs - the CLI (the GPU test scripts and the
# training benchmark), the GPU test binary and the attention and kernel
# benchmarks. Only these are built for a lease: the CPU tests and benchmarks
# are about half of a full build's compile time, which a stale pack would
# otherwise spend on device time.
zt_lease_targets=(zettatron zt_cuda_tests zt_bench_gpu_attention zt_bench_gpu_kernels)
