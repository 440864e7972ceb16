// Context parallelism's attention: ring attention over the cp group, with
// the sequence laid out zigzag so every rank does the same work.
//
// Layout: the T tokens of a sequence are cut into 2 P chunks of c = T / (2 P)
// (P = the cp group's size); cp rank r holds chunks r and 2P-1-r, in that
// order, as its 2c local rows. Causal attention then falls into blocks:
//   - its own keys: exactly causal attention on the 2c local rows (chunk
//     2P-1-r sees all of chunk r, and chunk r none of 2P-1-r);
//   - rank src < r's keys: every local query sees src's first chunk in full,
//     its second chunk not at all (2c x c, unmasked);
//   - rank src > r's keys: the local second chunk sees both of src's chunks
//     in full, the first chunk neither (c x 2c, unmasked).
// So each of the P - 1 remote steps is c x 2c unmasked work on every rank:
// balanced, where plain contiguous chunks would leave rank 0 idle.
//
// Forward: k and v go round the ring (each step one send_recv of the cp
// group: rank r sends to r + 1 and receives from r - 1; over NCCL a grouped
// ncclSend / ncclRecv, device to device) while the block in hand is computed; the blocks' partial (out, lse)
// are merged in f32: lse = log(e^lse + e^lse_b), out = e^(lse_old - lse) out
// + e^(lse_b - lse) out_b. P - 1 sends of k and v.
// Backward: each block's share of the gradient from the final out and lse
// (ops/attention.h); dq sums in f32 here, dk and dv sum in f32 buffers that
// travel with k and v and arrive home after P sends.
//
//   q, out, dq, dout: (B, 2c, Hq, D)   k, v, dk, dv: (B, 2c, Hkv, D)   lse: (B, Hq, 2c) f32
//   the local rows of one cp rank, every rank the same shapes; f32 or bf16
//   (f16 on GPUs), all on one device (the CPU or this rank's GPU: the blocks,
//   the merges and the sums are ops, the messages the group's send_recv).
// With P = 1 the calls are plain causal attention, bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace zt::nn {

// Which positions of a sequence of `seq_len` tokens cp rank `rank` of `cp`
// holds (the layout above).
struct ContextShard {
  int64_t seq_len = 1, cp = 1, rank = 0;

  int64_t chunk() const { return seq_len / (2 * cp); }  // c
  int64_t local_len() const { return seq_len / cp; }    // 2c
  // Start of the local rows' first and second chunk in the sequence.
  int64_t first_start() const { return rank * chunk(); }
  int64_t second_start() const { return (2 * cp - 1 - rank) * chunk(); }
  // The sequence position of local row i (0 <= i < 2c).
  int64_t position(int64_t i) const { return i < chunk() ? first_start() + i : second_start() + i - chunk(); }
  std::vector<int64_t> positions() const;
};

// Checks that seq_len splits into 2 cp equal chunks (throws zt::Error naming
// both numbers and the fix otherwise); pure, the same verdict on every rank.
ContextShard context_shard(int64_t seq_len, int64_t cp, int64_t rank);

// The local rows of a whole-sequence tensor x (B, seq_len, ...), dim 1 cut
// by the shard: (B, 2c, ...), a new tensor in x's category.
Tensor shard_rows(const Tensor& x, const ContextShard& shard);
// The same for a per-position table (rows >= seq_len, ...) along dim 0: its
// rows at the shard's positions, (2c, ...) - RoPE's table, learned positions.
Tensor shard_table_rows(const Tensor& table, const ContextShard& shard);
// table's rows at the shard's positions += rows (2c, ...); f32: a position
// table's gradient from the shard's.
void add_shard_table_rows(const Tensor& table, const Tensor& rows, const ContextShard& shard);

// out, lse <- causal attention of the whole sequence at this rank's rows.
// Collective over cp (every member calls it with the same shapes).
void ring_attention_forward(comm::ProcessGroup& cp, const Tensor& out, const Tensor& lse, const Tensor& q,
                            const Tensor& k, const Tensor& v, float scale = 0.0f);

// dq, dk, dv (overwritten) <- the gradients at this rank's rows, from the
// forward's out and lse. Collective over cp.
void ring_attention_backward(comm::ProcessGroup& cp, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, float scale = 0.0f);

// The transient buffers one call holds at its largest (bytes; the memory
// plan's ring terms), for local shapes q (B, 2c, Hq, D), k (B, 2c, Hkv, D)
// in `dtype` on a cp group of `cp` ranks (0 at cp = 1: plain attention):
//   comm       the receive slots - forward two of k and of v; backward also
//              two of the f32 dk, dv sums and this rank's own (4 s + 24
//              bytes per k element, s = dtype's size);
//   workspace  the blocks' outputs (all rows and half), the row copies
//              (q, dout, out, lse's second chunk; the first chunk of a lower
//              rank's k, v, which every rank but 0 takes), the f32 running
//              out or dq sum.
// Each the larger of the two directions (the backward's at every shape the
// model runs); what the block calls take for themselves (cuDNN's) is the
// backend's workspace (ops/workspace.h), not counted here.
struct RingBuffers {
  int64_t comm = 0, workspace = 0;
};
RingBuffers ring_attention_buffers(int64_t B, int64_t local_len, int64_t Hq, int64_t Hkv, int64_t D, DType dtype,
                                   int64_t cp);

}  // namespace zt::nn
