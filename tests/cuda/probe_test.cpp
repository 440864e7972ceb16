// GPU smoke test (CTest label "gpu"). Without a usable GPU it is skipped with
// a visible message, so CI machines without one stay green and honest.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "backend/cuda/device_probe.h"
#include "backend/cuda/runtime.h"

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

// Host-to-device copies are staged through pinned buffers and return without
// waiting: the host buffer may be overwritten at once, and many copies in
// flight (reusing the staging buffers as they complete) all land intact.
TEST(CudaRuntime, StagedUploadsLandIntactWhileTheHostBufferIsReused) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU here";
  const zt::Device gpu = zt::Device::cuda(0);
  zt::cuda::ensure_initialized(gpu);
  std::vector<int32_t> host;
  std::vector<std::pair<int32_t*, size_t>> uploads;
  for (int i = 0; i < 64; ++i) {
    const size_t n = size_t(1) << (i % 17);  // 1 .. 64 Ki ints: small and staging-buffer-sized copies
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, n * 4), cudaSuccess);
    host.assign(n, i);
    zt::cuda::copy_bytes(d, gpu, host.data(), zt::Device::cpu(), n * 4);
    host.assign(n, -1);  // overwritten at once: the upload must not see it
    uploads.push_back({static_cast<int32_t*>(d), n});
  }
  for (size_t i = 0; i < uploads.size(); ++i) {
    std::vector<int32_t> back(uploads[i].second);
    zt::cuda::copy_bytes(back.data(), zt::Device::cpu(), uploads[i].first, gpu, back.size() * 4);
    for (int32_t x : back) ASSERT_EQ(x, int32_t(i)) << "upload " << i;
    cudaFree(uploads[i].first);
  }
}

}  // namespace
