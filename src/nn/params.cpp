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
    if (sp.split_dim != 0) {  // pieces along a later dimension: every one owned, the whole local tensor
      for (const SlicePiece& pc : sp.pieces)
        ZT_ASSERT(pc.owner, sp.name, ": a piece along dimension ", sp.split_dim, " held by several ranks");
      add_range(off, off + n);
      continue;
    }
    const int64_t row = sp.shape[0] > 0 ? n / sp.shape[0] : 0;
    for (const SlicePiece& pc : sp.pieces)
      if (pc.owner) add_range(off + pc.local * row, off + (pc.local + pc.length) * row);
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

namespace {

// A local tensor of `spec` as (outer, along, inner) around its split
// dimension; the global tensor's part it lies in has the same outer and inner.
struct SplitAxes {
  int64_t outer = 1, along = 1, inner = 1;
};
SplitAxes split_axes(const Shape& s, int d) { return {s.prod(0, d), s[d], s.prod(d + 1, s.ndim())}; }

}  // namespace

void copy_pieces(const ParamSpec& spec, const Tensor& local, const Tensor& global, bool to_local) {
  if (!spec.sliced()) {
    to_local ? ops::copy(local, global) : ops::copy(global, local);
    return;
  }
  const int d = spec.split_dim;
  ZT_ASSERT(d >= 0 && d < local.ndim(), spec.name, ": split dimension ", d, " of a ", local.ndim(), "-D tensor");
  // The global tensor's run of dim 0 this rank holds (all of it unless dim0_start says otherwise).
  const Tensor g = d > 0 && local.size(0) != global.size(0) ? global.slice(spec.dim0_start, spec.dim0_start + local.size(0))
                                                            : global;
  const SplitAxes l = split_axes(local.shape(), d), gl = split_axes(g.shape(), d);
  ZT_ASSERT(l.outer == gl.outer && l.inner == gl.inner, spec.name, ": local ", local.shape().str(), " is no part of ",
            global.shape().str(), " along dimension ", d);
  for (int64_t o = 0; o < l.outer; ++o)
    for (const SlicePiece& pc : spec.pieces) {
      const Shape run{pc.length * l.inner};
      const Tensor lv = local.flat_view((o * l.along + pc.local) * l.inner, run);
      const Tensor gv = g.flat_view((o * gl.along + pc.global) * l.inner, run);
      to_local ? ops::copy(lv, gv) : ops::copy(gv, lv);
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
  const SplitAxes box = split_axes(extent, d);
  // The box's pieces along d, each one global box; when the box spans
  // several indices of the dimensions before d (its later ones whole) and
  // meets more than one piece, a piece's elements are not contiguous in the
  // box, so each index of those dimensions gets its own boxes.
  int met = 0;
  for (const SlicePiece& pc : spec.pieces) met += std::max(s, pc.local) < std::min(s + e, pc.local + pc.length);
  const bool split_outer = box.outer > 1 && met > 1;
  const int64_t outers = split_outer ? box.outer : 1;
  for (int64_t o = 0; o < outers; ++o) {
    // The box's index o of the dimensions before d (row-major), as a start.
    std::vector<int64_t> at = start;
    Shape ext = extent;
    if (split_outer) {
      int64_t rest = o;
      for (int j = d - 1; j >= 0; --j) {
        at[size_t(j)] = start[size_t(j)] + rest % extent[j];
        rest /= extent[j];
        ext[j] = 1;
      }
    }
    for (const SlicePiece& pc : spec.pieces) {
      if (owned_only && !pc.owner) continue;
      const int64_t a = std::max(s, pc.local), b = std::min(s + e, pc.local + pc.length);
      if (b <= a) continue;
      ZT_ASSERT(box.outer == 1 || split_outer || (a == s && b == s + e), spec.name,
                ": a box of several outer indices lies within one piece");
      GlobalBox g{(o * box.along + (a - s)) * box.inner, at, ext};
      g.start[size_t(d)] = pc.global + (a - pc.local);
      if (d > 0) g.start[0] += spec.dim0_start;
      std::vector<int64_t> dims(ext.begin(), ext.end());
      dims[size_t(d)] = b - a;
      g.extent = Shape(dims.begin(), dims.end());
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace zt::nn
