#include <cstdint>

#include "nn/params.h"

#include "core/error.h"
#include "core/rng.h"
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
}

size_t ParamSet::index(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  ZT_FAIL("no parameter named '", name, "'");
}

void ParamSet::zero_grads() {
  if (numel_ > 0 && grads_.defined()) ops::fill(grads_, 0.0);
}

void ParamSet::ensure_param_storage() {
  if (!params_.defined()) params_ = Tensor::empty(Shape{numel_}, dtype_, device_, MemCategory::params);
}

void ParamSet::ensure_grads() {
  if (grads_.defined()) return;
  grads_ = Tensor::empty(Shape{numel_}, DType::f32, device_, MemCategory::grads);
  zero_grads();
}

void ParamSet::init(uint64_t seed) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    const Tensor p = param(i);
    switch (s.init) {
      case Init::zeros: ops::fill(p, 0.0); break;
      case Init::ones: ops::fill(p, 1.0); break;
      case Init::normal: {
        Generator gen(param_seed(seed, s.name));
        ops::fill_normal(p, gen, 0.0f, s.std);
        break;
      }
    }
  }
}

}  // namespace zt::nn
