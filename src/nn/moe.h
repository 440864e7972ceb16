// The mixture-of-experts MLP of a block (ModelConfig::moe; Mixtral / Switch
// style): a router, E SwiGLU experts, each token through its top k.
//
//   logits (N, E) f32 = x Wr^T                 router, Wr (E, C)
//   probs, choice, weight = ops::moe_route      softmax, top k, (renormalised) weights
//   xs (N k, C)  = x's rows grouped by expert   ops::moe_gather
//   h_e  (n_e, 2F) = xs_e W_in[e]^T            [gate | up], W_in (E, 2F, C)
//   act_e (n_e, F) = silu(gate) * up
//   ys_e  (n_e, C) = act_e W_out[e]^T           W_out (E, C, F)
//   out (N, C) = residual + sum_j weight[t, j] ys[slot (t, j)]
//
// The load-balancing loss of the micro-batch (Switch Transformer, eq. 4):
// aux = coef * E * sum_e f_e P_e, f_e = n_e / (N k) (not differentiated),
// P_e = mean over tokens of probs[:, e]. The trainer's objective adds each
// block's aux weighted by the micro-batch's tokens times grad_scale (as the
// token losses are), so its gradient at probs[t, e] is
// grad_scale * coef * E * f_e whatever the accumulation. The router z-loss
// (ST-MoE, eq. 5), coef_z * mean over tokens of z_t^2 with z_t = logsumexp
// of token t's router logits, is counted the same way (gradient
// grad_scale coef_z 2 z_t p_te at logit e) and included in aux_loss.
//
// Under context parallelism a sequence's tokens are spread over the cp
// group: f_e and P_e are then the whole micro-batch's (the ranks' counts and
// probability sums are summed over the group: 2E + 1 doubles per block), so
// the loss and its gradient are those of the single process.
//
// The experts' products run per expert on its contiguous run of sorted rows.
// Dropless by default; with model.expert_capacity_factor = c > 0 each expert
// of a routing call (this rank's N tokens of a micro-batch, gathered under
// sequence parallelism) takes at most ceil(c N k / E) slots, its first ones
// in slot order (token-major: Switch / GShard's first come, first served),
// and drops the rest: a dropped slot adds nothing to its token's output (the
// residual carries the token on) and its weight gets no gradient. Under
// context parallelism the call is the micro-batch's, N the cp group's
// tokens and the first come in their order (each rank's counts per chunk
// and expert travel with the balancing sums: ops::SlotRuns), so a cp rank
// keeps and drops the slots the single process does. The
// balancing loss, the balancing biases and the load metrics count what the
// router chose, before the drop. The same in training, evaluation and
// generation.
//
// Expert parallelism (ExpertGroup): the E experts are split over the ep
// group, rank r holding experts [r E/ep, (r+1) E/ep). Each rank routes its
// own tokens over all E; its sorted rows for rank r's experts are one run
// (experts are ordered by owner), sent there with one all-to-all (the
// slots' per-expert counts gathered first, E i64 per rank); the owner
// computes its experts on the rows it received, regrouped expert-major
// (every source's rows of its first expert, then of its second, ...), and
// sends the outputs back in the same all-to-all shape. Backward sends the
// outputs' gradients the same way and the inputs' gradients back. The
// trainer runs it at parallel.ep > 1 (the experts' ParamSets then reduce
// over Mesh::ep_dp: parallel::SetGroups).
//
// Tensor parallelism (ExpertGroup::tensor) splits every expert's hidden
// width F as it splits a dense MLP's: rank r of tp holds F/tp of each
// expert's gate and up rows and the matching columns of its output
// product. The router is replicated and every tp rank routes the same
// (gathered) tokens alike, so the dispatch is the same on all of them; each
// computes its partial ys, the combine's output is this rank's partial sum
// (the caller reduces it over tp and adds the residual), and in backward
// the combine weights' gradient <dout, ys> is summed over tp (N k floats) and
// the router's input gradient added on tp rank 0 only, so the caller's
// reduction of the partial dx counts it once. Under both, the ep group joins
// the ranks of one tp index (parallel::Mesh): rank r's dispatch goes to the
// ranks holding the same columns of other experts.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "nn/model_config.h"
#include "ops/grad_write.h"

namespace zt::nn {

// Context parallelism's group (see above): its ranks' zigzag rows of the
// same sequences (nn/ring_attention.h) make one micro-batch, local_len rows
// (2c) of each sequence here; a null group or one of size 1: this rank's
// tokens are the micro-batch's.
struct SequenceShards {
  comm::ProcessGroup* group = nullptr;
  int64_t local_len = 0;
  bool parallel() const { return group && group->size() > 1; }
};

// Expert parallelism's group (see above).
struct ExpertGroup {
  comm::ProcessGroup* group = nullptr;  // the ep group (null or size 1: every expert here)
  comm::ProcessGroup* tensor = nullptr;  // the tp group over which the hidden width splits (null or size 1: whole)
  bool parallel() const { return group && group->size() > 1; }
  bool tensor_parallel() const { return tensor && tensor->size() > 1; }
};

// A block's MoE weights, or views of their gradients (f32).
struct MoeWeights {
  Tensor router;       // (E, C)
  Tensor experts_in;   // (E, 2F, C)
  Tensor experts_out;  // (E, C, F)
  // (E) f32 or undefined: the aux-loss-free balancing bias added to the
  // probabilities for the top-k choice (ModelConfig::router_bias_update_rate;
  // model state, not a parameter: no gradient).
  Tensor router_bias;
};

// What the MoE MLP keeps for its backward (host tensors on the CPU).
struct MoeActivations {
  Tensor probs;                  // (N, E) f32
  Tensor choice;                 // (N, k) i32
  Tensor weight;                 // (N, k) f32
  Tensor order, where;           // (N k) i32: the dispatch plan (ops/moe.h)
  std::vector<int64_t> offsets;  // (E + 1): expert e's sorted rows (kept slots)
  std::vector<int64_t> routed;   // (E): the slots the router gave each expert, before any drop
  Tensor xs;                     // (K, C) the experts' input rows: the K <= N k kept slots
  Tensor ys;                     // (K, C) the experts' outputs
  // The rows this rank's experts compute: xs and ys themselves, or under
  // expert parallelism the R rows received, expert-major.
  Tensor xe;                          // (R, C)
  Tensor h;                           // (R, 2F) [gate | up]
  Tensor act;                         // (R, F)
  std::vector<int64_t> local_offsets;  // (E_local + 1) local expert j's rows of xe
  // Expert parallelism: rows sent to / received from each ep rank, and the
  // permutations between the received (source-major) and the expert-major order.
  std::vector<int64_t> send_rows, recv_rows;
  Tensor to_expert_major;  // (R) i32: source-major row of expert-major row p
  Tensor to_source_major;  // (R) i32: the inverse
  std::vector<double> load;      // (E) slots per expert, over the balancing group (f_e = load / (N k) of it)
  double load_tokens = 0.0;      // N over the balancing group
  double dropped_share = 0.0;    // of the routing call's N k slots (over the group), those over capacity
  float grad_scale = 0.0f;       // the pass's (the aux loss's gradient scale)
  Tensor router_lse;             // (N) f32: z_t = logsumexp of token t's router logits (router_z_loss > 0)
  double aux_loss = 0.0;         // this micro-batch's load-balancing and z-loss, coefficients included
  bool defined() const { return probs.defined(); }
};

// out (N, C) = residual (N, C) + the MoE MLP of x (N, C); fills a (and a.aux_loss).
// Under tensor parallelism (experts.tensor) out is this rank's partial sum
// of the MLP, which the caller reduces over tp, so residual is then another
// partial sum to add (a shared expert's) or undefined.
// sequences: the ranks whose tokens make one micro-batch of the
// load-balancing loss and of a capacity's first come (the cp group; none:
// this rank's alone); x's rows then whole local sequences. A collective over
// it (one all-gather of 2E + 2 doubles, with a capacity 2E more per
// sequence) when it has several ranks.
// experts: the expert-parallel group (w holds this rank's E / ep experts).
void moe_forward(const ModelConfig& cfg, MoeActivations& a, const Tensor& out, const Tensor& x,
                 const Tensor& residual, const MoeWeights& w, const SequenceShards& sequences = {},
                 const ExpertGroup& experts = {});
// Selective recompute: drop what is cheap to make again (xs, act; under
// expert parallelism xs only, as xe came over the network), and make it again.
void moe_release_selective(MoeActivations& a);
void moe_recompute_selective(MoeActivations& a, const Tensor& x);

// Backward for dout (N, C), the gradient at out: dx (N, C) is overwritten
// with the gradient at x (the residual's gradient is dout itself, the
// caller's); under tensor parallelism dout is the whole (N, C) gradient on
// every tp rank and dx this rank's partial sum, to be reduced over tp. The weight gradients are work handed to `weights` (the
// router's) and `expert_weights` (the experts', which live in a set of
// their own), run at once or later (zero-bubble schedules); each looks its
// views up with `grads` when it runs and asks `claim` how to write each
// view - an expert's slice (true: the experts' set) or the router's - (a
// step's first write overwrites). Releases a's tensors
// but what the work keeps.
using WeightWork = std::function<void(std::function<void()>)>;
void moe_backward(const ModelConfig& cfg, MoeActivations& a, const Tensor& dx, const Tensor& dout, const Tensor& x,
                  const MoeWeights& w, const WeightWork& weights, const WeightWork& expert_weights,
                  std::function<MoeWeights()> grads, std::function<ops::GradWrite(const Tensor&, bool expert)> claim,
                  const ExpertGroup& experts = {});

// Per-expert slot counts of a forward as the router chose them (before any
// drop): for metrics and the balancing biases.
std::vector<int64_t> moe_expert_load(const MoeActivations& a);

// The most slots an expert takes in a routing call of N tokens:
// ceil(expert_capacity_factor N k / E), or -1 (no limit) when the factor is 0.
int64_t expert_capacity(const ModelConfig& cfg, int64_t N);

// Aux-loss-free balancing's step (ModelConfig::router_bias_update_rate):
// bias and load (layers, E) row-major, load the step's routed slots per
// block and expert. Each bias moves by + rate where its expert got fewer
// slots than the block's mean, - rate where more, not at all where equal or
// the block routed nothing. Compared in integers (E n_e against the total),
// so loads counted several times alike (a tp group's ranks each count the
// same tokens) move the biases as counted once.
void move_router_bias(std::vector<float>& bias, const std::vector<int64_t>& load, int64_t E, float rate);

}  // namespace zt::nn
