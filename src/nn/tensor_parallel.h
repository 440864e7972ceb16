// Tensor parallelism (Megatron style): how a model's layers split over a
// tensor-parallel group of tp ranks, and the collectives between the halves.
//
// Rank r of tp holds
//   attention   query heads [r Hq/tp, (r+1) Hq/tp) and their kv heads: kv heads
//               [r Hkv/tp, ...) when tp divides Hkv; when Hkv < tp (Hkv must
//               divide tp) each kv head is replicated on tp/Hkv consecutive
//               ranks, whose partial gradients of it are summed over that
//               "kv replica" group; proj's input columns of those heads
//   MLP         hidden columns [r F/tp, ...) (SwiGLU: of the gate and of the up
//               projection alike); mlp.out's input columns of them. A
//               mixture of experts: the same columns of every expert it
//               holds (nn/moe.h) and of the shared expert, the router replicated
//   vocabulary  rows [r Vl, r Vl + Vl) of wte and lm_head, Vl = ceil(Vp/tp):
//               the last rank's rows past Vp are padding no token reaches, so
//               any tp divides any vocabulary and the checkpoint shapes do not
//               depend on tp
//   the rest    (norms, row-parallel biases, wpe) replicated.
//
// Sequence parallelism keeps the residual stream, the norms and their
// outputs sharded along the B*T rows (rank r: rows [r N/tp, (r+1) N/tp)):
// an all-gather before each column-parallel matmul and a reduce-scatter
// after each row-parallel one replace the all-reduce (the same bytes), and
// the activations of those regions shrink by tp. Norm weight gradients are
// then partial per rank and summed over the group.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "nn/model_config.h"
#include "nn/params.h"

namespace zt::nn {

struct TensorParallel {
  comm::ProcessGroup* group = nullptr;  // null: no tensor parallelism
  bool sequence_parallel = false;
  // A pass's context-parallel group (set per pass by the model from
  // Transformer::context_parallel, not by its constructor): the pass's
  // tokens are this rank's zigzag rows of each sequence (nn/ring_attention.h).
  comm::ProcessGroup* context = nullptr;
  // Expert parallelism (mixture-of-experts models): the ep group, over which
  // each block's experts are split (rank r holds experts [r E/ep, (r+1)
  // E/ep)); tokens go to their experts' owners (nn/moe.h). Set at
  // construction; null: every expert here.
  comm::ProcessGroup* experts = nullptr;
  int64_t size() const { return group ? group->size() : 1; }
  int64_t rank() const { return group ? group->rank() : 0; }
};

// This rank's share of a model's dimensions.
struct TpShares {
  int64_t tp = 1, rank = 0;
  int64_t q_heads = 0;        // local query heads
  int64_t kv_heads = 0;       // local kv heads
  int64_t kv_head0 = 0;       // first global kv head held
  int64_t kv_replicas = 1;    // ranks holding the same kv heads (Hkv < tp)
  int64_t ff = 0;             // local MLP hidden width
  int64_t shared_ff = 0;      // MoE: the shared expert's local hidden width (0: none)
  int64_t vocab_rows = 0;     // Vl: local rows of wte / lm_head (padding included)
  int64_t vocab_start = 0;    // first global vocabulary row held
  int64_t vocab_real = 0;     // of the local rows, those < Vp (hold a global row)
  int64_t experts = 0;        // MoE: local experts (E / ep)
  int64_t expert0 = 0;        // the first global expert held
};

// Throws zt::Error naming the setting and the fix when cfg cannot split tp
// ways (heads, kv heads, d_ff). Pure: every rank reaches the same verdict.
void check_tensor_parallel(const ModelConfig& cfg, int64_t tp);
// ep, ep_rank: the expert-parallel size and this rank's place in it (MoE).
TpShares tp_shares(const ModelConfig& cfg, int64_t tp, int64_t rank, int64_t ep = 1, int64_t ep_rank = 0);

// The parameter specs of each layer for rank `s.rank` (global names, local
// shapes, pieces of the global tensors).
std::vector<ParamSpec> embedding_specs(const ModelConfig& c, const TpShares& s);
std::vector<ParamSpec> block_specs(const ModelConfig& c, const TpShares& s, size_t layer);
std::vector<ParamSpec> head_specs(const ModelConfig& c, const TpShares& s);

// Whether a parameter is one of a mixture-of-experts block's experts
// (mlp.experts.*): the model keeps them in a ParamSet of their own after
// their block's, which expert parallelism reduces over other ranks.
bool is_expert_param(const std::string& name);
// block_specs' specs split: (the block's own, its experts').
std::pair<std::vector<ParamSpec>, std::vector<ParamSpec>> split_expert_specs(std::vector<ParamSpec> specs);

// The spec of parameter `name` (global name) on the rank of `s`.
ParamSpec param_spec(const ModelConfig& c, const TpShares& s, const std::string& name);

// The global tensor of parameter `name` from every tp rank's local one (a
// collective over tp; every rank gets it). local: this rank's tensor.
Tensor gather_global(const Tensor& local, const ModelConfig& cfg, const TensorParallel& tp, const std::string& name);

}  // namespace zt::nn
