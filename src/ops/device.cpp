// Device movement front end: validation, then the CUDA runtime's copies (or
// memcpy on the host). See ops/device.h.
#include "ops/device.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "backend/cpu/blas_kernels.h"
#include "ops/check.h"
#if ZT_WITH_CUDA
#include "backend/cuda/environment.h"
#include "backend/cuda/runtime.h"
#endif

namespace zt::ops {

void read_device_environment() {
#if ZT_WITH_CUDA
  cuda::read_environment();
#endif
}

void init_device(Device device) {
  if (device.is_cpu()) return;
#if ZT_WITH_CUDA
  read_device_environment();  // a bad switch fails here, with or without a GPU
  return cuda::ensure_initialized(device);
#else
  ZT_FAIL("device ", device.str(), " requested, but this build has no CUDA backend (nvcc was not found when it "
          "was built); rebuild on a machine with the CUDA toolkit, or use device = \"cpu\"");
#endif
}

int gpu_count() {
#if ZT_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string gpu_uuid(int index) {
#if ZT_WITH_CUDA
  return cuda::device_info(index).uuid;
#else
  ZT_FAIL("gpu_uuid(", index, "): this build has no CUDA backend");
#endif
}

std::string describe_cpu() { return cpu::describe_blas_kernels(); }

void copy(const Tensor& dst, const Tensor& src) {
  const char* op = "copy";
  check_defined(op, "dst", dst);
  check_defined(op, "src", src);
  check_same_dtype(op, "dst", dst, "src", src);
  ZT_CHECK(dst.numel() == src.numel(), op, ": 'dst' ", dst.str(), " and 'src' ", src.str(),
           " must have the same number of elements");
  if (dst.same_as(src)) return;
  ZT_CHECK(!dst.overlaps(src), op, ": 'dst' ", dst.str(), " partially overlaps 'src' ", src.str());
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    if (src.nbytes() > 0) std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
#if ZT_WITH_CUDA
  cuda::copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.nbytes());
#else
  no_backend(op, dst.device().is_cpu() ? src.device() : dst.device());
#endif
}

void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols,
                  int64_t rows) {
  const char* op = "copy_columns";
  check_defined(op, "dst", dst);
  check_defined(op, "src", src);
  check_same_dtype(op, "dst", dst, "src", src);
  check_device(op, src.device(), {{"dst", &dst}});
  ZT_CHECK(rows > 0 && dst.numel() % rows == 0 && src.numel() % rows == 0, op, ": 'dst' ", dst.str(), " and 'src' ",
           src.str(), " must both split into rows = ", rows, " rows");
  const int64_t dst_row = dst.numel() / rows, src_row = src.numel() / rows;
  ZT_CHECK(cols >= 0 && dst_col >= 0 && src_col >= 0 && dst_col + cols <= dst_row && src_col + cols <= src_row, op,
           ": columns [", dst_col, ", ", dst_col + cols, ") of 'dst' (", dst_row, " a row) and [", src_col, ", ",
           src_col + cols, ") of 'src' (", src_row, " a row) must lie within their rows");
  check_disjoint(op, "dst", dst, "src", src);
  if (cols == 0) return;
  const size_t elem = dtype_size(src.dtype());
  const size_t width = size_t(cols) * elem, dst_pitch = size_t(dst_row) * elem, src_pitch = size_t(src_row) * elem;
  auto* d = static_cast<char*>(dst.data_ptr()) + size_t(dst_col) * elem;
  const auto* s = static_cast<const char*>(src.data_ptr()) + size_t(src_col) * elem;
  if (src.device().is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + size_t(r) * dst_pitch, s + size_t(r) * src_pitch, width);
    return;
  }
#if ZT_WITH_CUDA
  cuda::copy_bytes_2d(d, dst_pitch, s, src_pitch, width, size_t(rows), src.device());
#else
  no_backend(op, src.device());
#endif
}

Tensor to_device(const Tensor& src, Device device, MemCategory category) {
  init_device(device);
  Tensor out = Tensor::empty(src.shape(), src.dtype(), device, category);
  copy(out, src);
  return out;
}

Tensor on_device(const Tensor& src, Device device, MemCategory category) {
  return src.device() == device ? src : to_device(src, device, category);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#if ZT_WITH_CUDA
  cuda::synchronize(device);
#endif
}

void profiler_capture(Device device, bool on) {
  if (device.is_cpu()) return;
#if ZT_WITH_CUDA
  if (device.is_cuda()) {
    cuda::profiler_capture(on);
    return;
  }
#endif
  no_backend("profiler_capture", device);
}

DeviceMark::DeviceMark(Device device) : defined_(true) {
#if ZT_WITH_CUDA
  if (device.is_cuda()) {
    event_ = cuda::record_mark(device);
    return;
  }
#endif
  if (!device.is_cpu()) no_backend("DeviceMark", device);
  host_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

DeviceMark::~DeviceMark() {
#if ZT_WITH_CUDA
  if (event_) cuda::release_mark(event_);
#endif
}

DeviceMark::DeviceMark(DeviceMark&& o) noexcept
    : defined_(std::exchange(o.defined_, false)), host_seconds_(o.host_seconds_), event_(std::exchange(o.event_, nullptr)) {}

DeviceMark& DeviceMark::operator=(DeviceMark&& o) noexcept {
  if (this != &o) {
    DeviceMark old(std::move(*this));  // releases our event
    defined_ = std::exchange(o.defined_, false);
    host_seconds_ = o.host_seconds_;
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

double DeviceMark::seconds_since(const DeviceMark& start) const {
  ZT_CHECK(defined_ && start.defined_ && (event_ != nullptr) == (start.event_ != nullptr),
           "internal: DeviceMark::seconds_since needs two marks of one device");
#if ZT_WITH_CUDA
  if (event_) return double(cuda::elapsed_ms(start.event_, event_)) / 1e3;
#endif
  return host_seconds_ - start.host_seconds_;
}

}  // namespace zt::ops
