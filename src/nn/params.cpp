#include <algorithm>
#include <cstdint>

#include "nn/params.h"

#include "core/error.h"
#include "core/rng.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace zt::nn {

namespace {
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t param_seed(uint64_t seed, std::string_view name) { return splitmix64(seed ^ fnv1a(name)); }

ParamSet::ParamSet(std::vector<ParamSpec> specs, DType dtype, Device device, int64_t pad_multiple)
    : specs_(std::move(specs)), dtype_(dtype), device_(device) {
  for (const ParamSpec& s : specs_) {
    offsets_.push_back(numel_);
    numel_ += s.shape.numel();
  }
  ZT_ASSERT(pad_multiple >= 1, "pad_multiple ", pad_multiple);
  const int64_t used = numel_;
  numel_ = (numel_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  params_ = Tensor::empty(Shape{numel_}, dtype, device, MemCategory::params);
  grads_ = Tensor::empty(Shape{numel_}, DType::f32, device, MemCategory::grads);
  if (numel_ > used) ops::fill(params_.flat_view(used, Shape{numel_ - used}), 0.0);
  zero_grads();
  // The elements this rank counts in the gradient norm, merged into runs.
  auto add_range = [&](int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    if (!norm_ranges_.empty() && norm_ranges_.back().second == lo)
      norm_ranges_.back().second = hi;
    else
      norm_ranges_.push_back({lo, hi});
  };
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& sp = specs_[i];
    const int64_t off = offsets_[i], n = sp.shape.numel();
    if (!sp.sliced()) {
      if (sp.owner) add_range(off, off + n);
      continue;
    }
    const int64_t row = sp.split_dim == 0 && sp.shape[0] > 0 ? n / sp.shape[0] : 0;
    for (const SlicePiece& pc : sp.pieces) {
      if (!pc.owner) continue;
      if (sp.split_dim == 0)
        add_range(off + pc.local * row, off + (pc.local + pc.length) * row);
      else
        add_range(off, off + n);  // a column split has one piece: the whole local tensor
    }
  }
  // Padding (zero gradients) joins the last run: one reduction per set when unsharded.
  if (!norm_ranges_.empty() && norm_ranges_.back().second == used) norm_ranges_.back().second = numel_;
}

size_t ParamSet::index(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  ZT_FAIL("no parameter named '", name, "'");
}

void ParamSet::zero_grads() {
  if (numel_ > 0 && grads_.defined()) ops::fill(grads_, 0.0);
  stale_ = false;
  written_.clear();
}

void ParamSet::begin_grads() {
  if (!lazy_grads_ || !grads_.defined()) return zero_grads();
  stale_ = true;
  written_.clear();
}

ops::GradWrite ParamSet::claim_grads(const Tensor& view) {
  if (!stale_ || !view.defined()) return ops::GradWrite::accumulate;
  const auto* base = static_cast<const char*>(grads_.data_ptr());
  const auto* at = static_cast<const char*>(view.data_ptr());
  const int64_t begin = (at - base) / int64_t(sizeof(float)), end = begin + view.numel();
  ZT_ASSERT(view.dtype() == DType::f32 && at >= base && end <= numel_,
            "claim_grads: the view is not in this set's gradient buffer");
  for (const auto& [b, e] : written_) {
    if (b <= begin && end <= e) return ops::GradWrite::accumulate;
    ZT_ASSERT(end <= b || e <= begin, "claim_grads: elements [", begin, ", ", end,
              ") overlap a part of those claimed before, [", b, ", ", e, ")");
  }
  written_.push_back({begin, end});
  return ops::GradWrite::overwrite;
}

void ParamSet::finish_grads() {
  if (!stale_) return;
  stale_ = false;
  std::sort(written_.begin(), written_.end());
  int64_t at = 0;
  for (const auto& [b, e] : written_) {
    if (b > at) ops::fill(grads_.flat_view(at, Shape{b - at}), 0.0);
    at = e;
  }
  if (at < numel_) ops::fill(grads_.flat_view(at, Shape{numel_ - at}), 0.0);
  written_.clear();
}

void ParamSet::ensure_param_storage() {
  if (!params_.defined()) params_ = Tensor::empty(Shape{numel_}, dtype_, device_, MemCategory::params);
}

void ParamSet::ensure_grads() {
  if (grads_.defined()) return;
  grads_ = Tensor::empty(Shape{numel_}, DType::f32, device_, MemCategory::grads);
  zero_grads();  // a lazy step under way goes on adding into these zeros
}

void ParamSet::init(uint64_t seed) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    // A slice is cut from the global tensor drawn whole: the values do not
    // depend on the tensor-parallel size.
    const Tensor local = param(i);
    const Tensor p = s.sliced() ? Tensor::empty(s.global(), dtype_, device_, MemCategory::params) : local;
    switch (s.init) {
      case Init::zeros: ops::fill(p, 0.0); break;
      case Init::ones: ops::fill(p, 1.0); break;
      case Init::normal: {
        Generator gen(param_seed(seed, s.name));
        ops::fill_normal(p, gen, 0.0f, s.std);
        break;
      }
    }
    if (s.sliced()) {
      ops::fill(local, 0.0);  // rows no piece covers (vocabulary padding) stay zero
      copy_pieces(s, local, p, true);
    }
  }
}

void copy_pieces(const ParamSpec& spec, const Tensor& local, const Tensor& global, bool to_local) {
  if (!spec.sliced()) {
    to_local ? ops::copy(local, global) : ops::copy(global, local);
    return;
  }
  for (const SlicePiece& pc : spec.pieces) {
    if (spec.split_dim == 0) {
      const Tensor l = local.slice(pc.local, pc.local + pc.length), g = global.slice(pc.global, pc.global + pc.length);
      to_local ? ops::copy(l, g) : ops::copy(g, l);
      continue;
    }
    ZT_ASSERT(spec.split_dim == 1 && local.ndim() == 2, spec.name, ": column pieces need a 2-D tensor");
    const int64_t rows = local.size(0), wl = local.size(1), wg = global.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      const Tensor l = local.flat_view(r * wl + pc.local, Shape{pc.length});
      const Tensor g = global.flat_view(r * wg + pc.global, Shape{pc.length});
      to_local ? ops::copy(l, g) : ops::copy(g, l);
    }
  }
}

std::vector<GlobalBox> to_global_boxes(const ParamSpec& spec, const std::vector<int64_t>& start, const Shape& extent,
                                       bool owned_only) {
  std::vector<GlobalBox> out;
  if (!spec.sliced()) {
    if (!owned_only || spec.owner) out.push_back({0, start, extent});
    return out;
  }
  const int d = spec.split_dim;
  const int64_t s = start[size_t(d)], e = extent[d];
  // Elements of the box per index along d (d = 0: a box row; d = 1: one, the box being one row or whole rows).
  const int64_t stride = d == 0 ? extent.numel() / std::max<int64_t>(1, e) : 1;
  for (const SlicePiece& pc : spec.pieces) {
    if (owned_only && !pc.owner) continue;
    const int64_t a = std::max(s, pc.local), b = std::min(s + e, pc.local + pc.length);
    if (b <= a) continue;
    ZT_ASSERT(d == 0 || extent[0] == 1 || (a == s && b == s + e), spec.name,
              ": a box of several rows must lie within one column piece");
    GlobalBox box{(a - s) * stride, start, extent};
    box.start[size_t(d)] = pc.global + (a - pc.local);
    std::vector<int64_t> dims(extent.begin(), extent.end());
    dims[size_t(d)] = b - a;
    box.extent = Shape(dims.begin(), dims.end());
    out.push_back(std::move(box));
  }
  return out;
}

}  // namespace zt::nn
