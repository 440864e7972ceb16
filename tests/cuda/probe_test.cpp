// GPU smoke test (CTest label "gpu"). Without a usable GPU it is skipped with
// a visible message, so CI machines without one stay green and honest.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include "backend/cuda/device_probe.h"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(CudaProbe, KernelRunsOnTheGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU here: " << zt::cuda::describe_devices();
  EXPECT_TRUE(zt::cuda::run_probe_kernel());
  EXPECT_NE(zt::cuda::describe_devices().find("cuda:0"), std::string::npos);
}

}  // namespace
