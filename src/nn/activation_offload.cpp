#include "nn/activation_offload.h"

#include <functional>
#include <utility>
#include <vector>

#include "ops/device.h"

namespace zt::nn {
namespace {

// Every tensor field of a block's activations (BlockActivations and its
// MoeActivations): a new field must be listed here to be offloaded.
void for_each_tensor(BlockActivations& a, const std::function<void(Tensor&)>& f) {
  for (Tensor* t : {&a.x_in, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.q, &a.k, &a.v, &a.qkv, &a.att, &a.lse, &a.res_mid,
                    &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.mlp_in, &a.act})
    f(*t);
  MoeActivations& m = a.moe;
  for (Tensor* t : {&m.probs, &m.choice, &m.weight, &m.order, &m.where, &m.xs, &m.ys, &m.xe, &m.h, &m.act,
                    &m.to_expert_major, &m.to_source_major, &m.router_lse})
    f(*t);
}

// Moves the tensors `pick` selects to `to` in `category`, one copy per exact alias.
int64_t move_tensors(BlockActivations& a, const std::function<bool(const Tensor&)>& pick, Device to,
                     MemCategory category) {
  std::vector<std::pair<Tensor, Tensor>> moved;  // (original, its copy)
  int64_t bytes = 0;
  for_each_tensor(a, [&](Tensor& t) {
    if (!t.defined() || !pick(t)) return;
    for (const auto& [from, copy] : moved)
      if (from.same_as(t)) {
        t = copy;
        return;
      }
    Tensor copy = ops::to_device(t, to, category);
    bytes += int64_t(t.nbytes());
    moved.emplace_back(t, copy);
    t = copy;
  });
  return bytes;
}

}  // namespace

int64_t offload_block(BlockActivations& a, Device device) {
  return move_tensors(
      a, [&](const Tensor& t) { return t.device() == device && t.category() != MemCategory::offload; }, Device::cpu(),
      MemCategory::offload);
}

int64_t restore_block(BlockActivations& a, Device device) {
  return move_tensors(
      a, [](const Tensor& t) { return t.category() == MemCategory::offload; }, device, MemCategory::activations);
}

}  // namespace zt::nn
