// GPU smoke test (CTest label "gpu"). Without a usable GPU it is skipped with
// a visible message, so CI machines without one stay green and honest.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "backend/cuda/device_probe.h"
#include "backend/cuda/runtime.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

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

// An event that is not ready yet leaves no error behind: cudaEventQuery's
// "not ready" also sets the thread's last CUDA error, and the next kernel's
// launch check would report it as a failure. Both places that poll events
// (the staging buffers, event_completed) must clear it.
TEST(CudaRuntime, PollingABusyEventDoesNotFailTheNextLaunch) {
  if (!have_gpu()) GTEST_SKIP() << "no usable GPU here";
  const zt::Device gpu = zt::Device::cuda(0);
  zt::cuda::ensure_initialized(gpu);
  using zt::Shape;
  const zt::Tensor a = zt::Tensor::empty(Shape{8192, 8192}, zt::DType::bf16, gpu);
  zt::Tensor c = zt::Tensor::empty(Shape{8192, 8192}, zt::DType::bf16, gpu);
  zt::ops::fill(a, 0.5);
  for (int i = 0; i < 4; ++i) zt::ops::matmul(c, a, a);  // ~4 TFLOP: milliseconds of queued work
  const zt::cuda::TimingMark mark = zt::cuda::record_mark(gpu);
  const bool done_at_once = zt::cuda::event_completed(mark, "test");
  // Uploads of one size while the GPU is busy: later ones find earlier staging buffers in use.
  std::vector<float> host(1 << 12, 1.0f);
  std::vector<zt::Tensor> dst;
  for (int i = 0; i < 8; ++i) {
    dst.push_back(zt::Tensor::empty(Shape{1 << 12}, zt::DType::f32, gpu));
    zt::cuda::copy_bytes(dst.back().data_ptr(), gpu, host.data(), zt::Device::cpu(), host.size() * 4);
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_NO_THROW(zt::ops::fill(c, 1.0));  // a kernel launch and its check
  zt::cuda::synchronize(gpu);
  EXPECT_TRUE(zt::cuda::event_completed(mark, "test"));
  zt::cuda::release_mark(mark);
  if (done_at_once) GTEST_SKIP() << "the GPU finished the products before the first poll: the not-ready path did not run";
}

}  // namespace
