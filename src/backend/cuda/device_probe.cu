// The CUDA backend's first translation unit: reports the GPUs this build can
// see. It exists so the CUDA toolchain (nvcc, sm_90a/sm_80 code generation,
// cudart linkage) is compiled in every CI run; the kernels of the CUDA
// backend join it here.
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/device_probe.h"

namespace zt::cuda {

namespace {
__global__ void probe_kernel(int* out) { *out = 42; }
}  // namespace

std::string describe_devices() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("CUDA: no usable GPU (") + cudaGetErrorString(err) + ")";
  std::string s = "CUDA: " + std::to_string(count) + " GPU(s)";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      s += "\n  cuda:" + std::to_string(i) + " " + prop.name + ", sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB";
  }
  return s;
}

bool run_probe_kernel() {
  int* d = nullptr;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
  probe_kernel<<<1, 1>>>(d);
  int h = 0;
  const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 42;
  cudaFree(d);
  return ok;
}

}  // namespace zt::cuda
