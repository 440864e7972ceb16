// A rank's slices of the global tensors (nn/params.h): copy_pieces and
// to_global_boxes for every rank of tensor x expert parallel layouts, on the
// stacked expert tensors (split along dimension 1 or 2 and holding a run of
// dimension 0) and on the dense ones. The ranks' local tensors cut from a
// random global tensor put it back whole, and every box a checkpoint would
// write of any flat range of a local tensor holds, element for element, the
// global tensor's values at the place the box names.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "nn/model_config.h"
#include "nn/params.h"
#include "nn/tensor_parallel.h"
#include "test_util.h"

namespace zt::nn {
namespace {

// Row-major flat index of `index` in `shape`.
int64_t flat_index(const Shape& shape, const std::vector<int64_t>& index) {
  int64_t at = 0;
  for (int d = 0; d < shape.ndim(); ++d) at = at * shape[d] + index[size_t(d)];
  return at;
}

// Every element of the box (start, extent) of `global` in row-major order.
std::vector<float> box_values(const Tensor& global, const std::vector<int64_t>& start, const Shape& extent) {
  std::vector<float> out;
  std::vector<int64_t> i(size_t(extent.ndim()), 0);
  for (int64_t n = 0; n < extent.numel(); ++n) {
    std::vector<int64_t> at = start;
    for (size_t d = 0; d < i.size(); ++d) at[d] += i[d];
    out.push_back(global.data<float>()[flat_index(global.shape(), at)]);
    for (int d = extent.ndim() - 1; d >= 0 && ++i[size_t(d)] == extent[d]; --d) i[size_t(d)] = 0;
  }
  return out;
}

struct Holder {
  int64_t tp, tp_rank, ep, ep_rank;
};

void expect_slices_rebuild_and_box(const ModelConfig& c, const std::string& name, const std::vector<Holder>& ranks) {
  std::mt19937_64 rng(test::test_seed());
  const ParamSpec any = param_spec(c, tp_shares(c, ranks[0].tp, 0, ranks[0].ep, 0), name);
  const Tensor global = test::random_tensor(any.global(), DType::f32, rng);
  const Tensor rebuilt = Tensor::empty(any.global(), DType::f32);
  test::poison(rebuilt);
  for (const Holder& h : ranks) {
    SCOPED_TRACE(name + " at tp rank " + std::to_string(h.tp_rank) + " of " + std::to_string(h.tp) + ", ep rank " +
                 std::to_string(h.ep_rank) + " of " + std::to_string(h.ep));
    const ParamSpec spec = param_spec(c, tp_shares(c, h.tp, h.tp_rank, h.ep, h.ep_rank), name);
    ASSERT_TRUE(spec.sliced());
    const Tensor local = Tensor::empty(spec.shape, DType::f32);
    test::poison(local);
    copy_pieces(spec, local, global, true);
    copy_pieces(spec, local, rebuilt, false);
    // Flat ranges of the local tensor as a ZeRO shard cuts them: the whole,
    // halves, and ranges starting and ending inside rows and experts.
    const int64_t n = spec.shape.numel();
    std::vector<std::pair<int64_t, int64_t>> ranges{{0, n}, {0, n / 2}, {n / 2, n}};
    for (int r = 0; r < 6; ++r) {
      const int64_t a = int64_t(rng() % uint64_t(n)), b = a + 1 + int64_t(rng() % uint64_t(n - a));
      ranges.push_back({a, b});
    }
    for (const auto& [lo, hi] : ranges) {
      std::vector<int> covered(size_t(hi - lo), 0);
      int64_t at = 0;
      for (const auto& [start, extent] : ckpt::flat_range_boxes(spec.shape, lo, hi)) {
        for (const GlobalBox& g : to_global_boxes(spec, start, extent, false)) {
          const std::vector<float> want = box_values(global, g.start, g.extent);
          for (int64_t e = 0; e < g.extent.numel(); ++e) {
            ASSERT_LT(at + g.offset + e, hi - lo) << "a box reaches past the range [" << lo << ", " << hi << ")";
            ++covered[size_t(at + g.offset + e)];
            ASSERT_EQ(local.data<float>()[lo + at + g.offset + e], want[size_t(e)])
                << "range [" << lo << ", " << hi << "), box at " << g.start[0] << "...";
          }
        }
        at += extent.numel();
      }
      for (size_t e = 0; e < covered.size(); ++e)
        ASSERT_EQ(covered[e], 1) << "element " << lo + int64_t(e) << " of range [" << lo << ", " << hi << ") written "
                                 << covered[e] << " times";
    }
  }
  for (int64_t i = 0; i < global.numel(); ++i)
    ASSERT_EQ(rebuilt.data<float>()[i], global.data<float>()[i]) << name << ": element " << i << " not rebuilt";
}

std::vector<Holder> every_rank(int64_t tp, int64_t ep) {
  std::vector<Holder> out;
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t e = 0; e < ep; ++e) out.push_back({tp, t, ep, e});
  return out;
}

TEST(ParamSlices, ExpertsSplitOverTensorAndExpertParallelRanks) {
  const ModelConfig c = model_preset("llama3-moe-tiny");  // 4 experts, d_ff 96, d_model 64
  for (const auto& [tp, ep] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {1, 2}, {2, 2}, {4, 2}, {2, 4}})
    for (const char* tensor : {"layers.1.mlp.experts.in.weight", "layers.1.mlp.experts.out.weight"}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " x ep " + std::to_string(ep));
      expect_slices_rebuild_and_box(c, tensor, every_rank(tp, ep));
    }
}

TEST(ParamSlices, DenseTensorsSplitOverTensorParallelRanks) {
  const ModelConfig c = model_preset("llama3-tiny");
  for (int64_t tp : {2, 4})
    for (const char* tensor : {"layers.0.attn.qkv.weight", "layers.0.attn.proj.weight", "layers.0.mlp.in.weight",
                               "layers.0.mlp.out.weight"})
      expect_slices_rebuild_and_box(c, tensor, every_rank(tp, 1));
}

}  // namespace
}  // namespace zt::nn
