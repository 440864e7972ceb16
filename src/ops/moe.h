// Mixture-of-experts routing, dispatch and combine (nn/moe.h builds the
// layer from these and ordinary products).
//
// N tokens, E experts, k experts per token. A token's k choices are its
// "slots" s = token * k + j. Dispatch groups the N k slots by expert (each
// expert's slots in slot order, so the grouping does not depend on threads):
// `order` lists slot ids by sorted position, expert e's rows are positions
// [offsets[e], offsets[e + 1]) and `where` (N k) i32 is the inverse (the
// sorted position of each slot). Expert e's products then run over a
// contiguous run of rows. Under a capacity an expert keeps its first slots
// only: the sorted rows are then R <= N k, and a dropped slot's `where` is
// -1 (it adds nothing to its token's output and gets no gradient).
//
// Dtypes: router logits, probabilities and weights f32; token rows (x, y,
// their gradients) f32 or bf16 (or f16 on a GPU), summed in f32 and rounded
// once. Devices: the CPU and CUDA GPUs. The dispatch plan (order, where,
// offsets) is always on the host, where it is made and checked; the ops
// that read it on a GPU upload it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace zt::ops {

// probs (N, E) = softmax(logits (N, E)) over experts; choice (N, k) i32 the k
// most probable experts in descending probability (ties: the lower index);
// weight (N, k) = probs at choice, divided by their sum when normalize.
// lse (N) f32 or undefined: each row's logsumexp (the router z-loss's z).
// bias (E) f32 or undefined: added to every row's probabilities for the
// choice only (aux-loss-free balancing, DeepSeek-V3): the k largest of
// probs + bias are chosen, their weights still the probabilities'.
void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               bool normalize, const Tensor& lse = {}, const Tensor& bias = {});

// Backward of moe_route and of the load-balancing loss:
//   dlogits (N, E) = softmax backward of dprobs, where dprobs[t, e] =
//   aux_dprob[e] (every token; undefined: 0) + the weights' gradient dweight
//   (N, k) taken back through the optional normalisation to the chosen probs;
//   plus dlse[t] probs[t, e] when dlse (N) f32, the gradient at each row's
//   logsumexp, is defined (the router z-loss's).
// Overwritten. probs, choice, weight as moe_route wrote them.
void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        const Tensor& weight, bool normalize, const Tensor& aux_dprob, const Tensor& dlse = {});

// The grouping of slots by expert, each expert keeping at most `capacity`
// slots (capacity -1: every slot, dropless): its first ones in slot order
// (Switch / GShard's first-come policy), the rest dropped. On the host:
// offsets (E + 1) the experts' runs of kept rows, R = offsets[E] rows in
// all; order (N k) i32 the kept slots' ids by sorted position in [0, R), -1
// after; where (N k) i32 each slot's sorted position, -1 for a dropped
// slot. routed (E) or null: each expert's slots before dropping (what the
// router asked of it). choice (N, k) i32, every id in [0, E) (checked); a
// GPU's is copied to the host first (the caller waits for the routing: the
// runs' lengths size the experts' products).
// runs: where this rank's slots are pieces of a larger routing call's slot
// order (context parallelism: a cp rank's zigzag chunks of each sequence),
// the first come is that call's - see SlotRuns; null: these N k slots are
// the call.
struct SlotRuns;
void moe_dispatch_plan(const Tensor& order, const Tensor& where, std::vector<int64_t>& offsets,
                       const Tensor& choice, int64_t E, int64_t capacity = -1,
                       std::vector<int64_t>* routed = nullptr, const SlotRuns* runs = nullptr);
// The rank's N k slots as runs [start[i], start[i + 1]) (start[0] = 0,
// ascending, the last run ending at N k), each contiguous in the routing
// call's slot order, and ahead[i E + e] the slots of expert e before run i's
// first in that order (every rank's). A slot is kept when fewer than
// `capacity` of its expert's slots come before it in the call.
struct SlotRuns {
  std::vector<int64_t> start, ahead;
};

// xs (R, C)[p] = x (N, C)[order[p] / k]: each expert's input rows; order
// (R) the plan's first R entries (R <= N k: the kept slots).
void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& order, int64_t k);
// dx (N, C)[t] = sum over j of dxs (R, C)[where[t k + j]] (j in order, f32,
// one rounding; dropped slots add nothing): the gather's backward;
// overwritten, or added to dx when accumulate (one rounding of dx + the sum).
void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& where, int64_t k, bool accumulate);

// out (N, C)[t] = residual[t] + sum over kept j of weight[t, j] ys (R,
// C)[where[t k + j]] (f32, j in order, one rounding; residual undefined: 0).
void moe_combine(const Tensor& out, const Tensor& ys, const Tensor& weight, const Tensor& where,
                 const Tensor& residual);
// Backward of moe_combine for dout (N, C), over the kept slots:
//   dys (R, C)[where[t k + j]] = weight[t, j] dout[t]
//   dweight (N, k)[t, j]       = <dout[t], ys[where[t k + j]]>   (f32; 0 for a dropped slot)
void moe_combine_backward(const Tensor& dys, const Tensor& dweight, const Tensor& dout, const Tensor& ys,
                          const Tensor& weight, const Tensor& where);

}  // namespace zt::ops
