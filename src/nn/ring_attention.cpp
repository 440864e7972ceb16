// Ring attention over the cp group (the layout and the schedule are in
// ring_attention.h). The blocks run through ops::attention_*; this file
// moves k, v (and their gradients) round the ring and merges the blocks.
#include "nn/ring_attention.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/attention.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace zt::nn {
namespace {

// Tags of the ring's messages: k, v forward and backward, then dk, dv.
constexpr int kTagK = 0x5a01, kTagV = 0x5a02, kTagDk = 0x5a03, kTagDv = 0x5a04;

// Local rows [t0, t0 + n) of x (B, T, H, D) (any dtype): a new contiguous
// tensor on x's device.
Tensor rows_of(const Tensor& x, int64_t t0, int64_t n) {
  const int64_t B = x.size(0), row = x.size(2) * x.size(3);
  Tensor r = Tensor::empty(Shape{B, n, x.size(2), x.size(3)}, x.dtype(), x.device(), MemCategory::workspace);
  ops::copy_columns(r, 0, x, t0 * row, n * row, B);
  return r;
}

// Rows [t0, t0 + n) of lse (B, H, T) f32 along its last dim: (B, H, n).
Tensor lse_rows_of(const Tensor& lse, int64_t t0, int64_t n) {
  Tensor r = Tensor::empty(Shape{lse.size(0), lse.size(1), n}, DType::f32, lse.device(), MemCategory::workspace);
  ops::copy_columns(r, 0, lse, t0, n, lse.size(0) * lse.size(1));
  return r;
}

// An f32 copy of x on its device: a running sum started from its first term.
Tensor f32_copy(const Tensor& x, MemCategory category) {
  Tensor t = Tensor::empty(x.shape(), DType::f32, x.device(), category);
  ops::cast(t, x);
  return t;
}

// acc (B, T, H, D) f32 rows [t0, t0 + n) += part (B, n, H, D): one rounding
// of each sum to f32 (ops::axpy with alpha 1), a sequence at a time.
void add_rows(const Tensor& acc, const Tensor& part, int64_t t0) {
  const int64_t B = part.size(0), n = part.size(1), T = acc.size(1);
  if (n == T) return ops::axpy(acc, 1.0f, part);
  const Tensor a = acc.view(Shape{B * T, acc.numel() / (B * T)});
  const Tensor p = part.view(Shape{B * n, part.numel() / (B * n)});
  for (int64_t b = 0; b < B; ++b) ops::axpy(a.slice(b * T + t0, b * T + t0 + n), 1.0f, p.slice(b * n, (b + 1) * n));
}

// What both directions check before the first message, so a bad call fails
// on the rank that made it instead of leaving its peers waiting: the local
// shapes, one float dtype, one device, 2c rows.
void check_local(const char* op, const comm::ProcessGroup& cp, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, const Tensor& lse, std::initializer_list<std::pair<const char*, const Tensor*>> more) {
  ZT_CHECK(q.ndim() == 4 && k.ndim() == 4, op, ": q ", q.shape().str(), " and k ", k.shape().str(),
           " must be (B, T, heads, D)");
  const int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2);
  ZT_CHECK(T % 2 == 0, op, ": this cp rank holds ", T, " rows of the sequence; the zigzag layout gives every rank ",
           "two equal chunks, so the local length must be even (seq_len a multiple of 2 cp = ", 2 * cp.size(), ")");
  ZT_CHECK(k.shape() == Shape({B, T, Hkv, D}) && v.shape() == k.shape(), op, ": k ", k.shape().str(), " and v ",
           v.shape().str(), " must be (B, T, Hkv, D) = (", B, ", ", T, ", Hkv, ", D, ") like q ", q.shape().str());
  ZT_CHECK(Hkv > 0 && Hq % Hkv == 0, op, ": q has ", Hq, " heads and k ", Hkv,
           "; the query heads must be a positive multiple of the kv heads");
  ZT_CHECK(out.shape() == q.shape(), op, ": out ", out.shape().str(), " must have q's shape ", q.shape().str());
  ZT_CHECK(lse.shape() == Shape({B, Hq, T}) && lse.dtype() == DType::f32, op, ": lse ", lse.shape().str(), " ",
           dtype_name(lse.dtype()), " must be (B, Hq, T) = ", Shape({B, Hq, T}).str(), " f32");
  ZT_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16 || (q.dtype() == DType::f16 && !q.device().is_cpu()),
           op, ": q is ", dtype_name(q.dtype()), " on ", q.device().str(),
           "; ring attention runs on f32 or bf16 (f16 on GPUs)");
  std::vector<std::pair<const char*, const Tensor*>> all = {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}};
  all.insert(all.end(), more.begin(), more.end());
  for (const auto& [name, t] : all) {
    ZT_CHECK(t->dtype() == q.dtype(), op, ": '", name, "' is ", dtype_name(t->dtype()), " but q is ",
             dtype_name(q.dtype()), "; pass them all in one dtype");
    ZT_CHECK(t->device() == q.device(), op, ": '", name, "' is on ", t->device().str(), " but q on ",
             q.device().str(), "; pass them all on one device");
  }
  ZT_CHECK(lse.device() == q.device(), op, ": 'lse' is on ", lse.device().str(), " but q on ", q.device().str(),
           "; pass them all on one device");
}

// The ring's buffers: two of each, step s computing on one (s - 1) % 2 while
// the next block arrives in the other.
struct RingSlots {
  Tensor k[2], v[2], dk[2], dv[2];
};

// One ring step of `held` (to the next rank) into slot `into` (from the
// previous): a collective of the cp group, every rank the same sequence.
comm::WorkHandle pass_on(comm::ProcessGroup& cp, const Tensor& held, const Tensor& into, int tag) {
  const int P = cp.size(), r = cp.rank();
  return cp.send_recv(held, (r + 1) % P, into, (r + P - 1) % P, tag);
}

void wait_all(std::vector<comm::WorkHandle>& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

}  // namespace

std::vector<int64_t> ContextShard::positions() const {
  std::vector<int64_t> p(static_cast<size_t>(local_len()));
  for (int64_t i = 0; i < local_len(); ++i) p[size_t(i)] = position(i);
  return p;
}

ContextShard context_shard(int64_t seq_len, int64_t cp, int64_t rank) {
  ZT_CHECK(cp >= 1 && rank >= 0 && rank < cp, "context_shard: rank ", rank, " of cp = ", cp, " is out of range");
  ZT_CHECK(seq_len > 0 && seq_len % (2 * cp) == 0, "context parallelism: train.seq_len = ", seq_len,
           " does not split into 2 cp = ", 2 * cp, " equal chunks (each cp rank holds two, for balance); set "
           "train.seq_len to a multiple of ", 2 * cp, " or parallel.cp to a divisor of seq_len / 2");
  return ContextShard{seq_len, cp, rank};
}

Tensor shard_rows(const Tensor& x, const ContextShard& shard) {
  ZT_CHECK(x.ndim() >= 2 && x.size(1) == shard.seq_len, "shard_rows: ", x.str(), " must be (B, seq_len = ",
           shard.seq_len, ", ...)");
  std::vector<int64_t> dims(x.shape().begin(), x.shape().end());
  dims[1] = shard.local_len();
  Tensor r = Tensor::empty(Shape(dims.begin(), dims.end()), x.dtype(), x.device(), x.category());
  // Per sequence (a row of seq_len x `row` elements): its first chunk, then its second.
  const int64_t row = x.numel() / (x.size(0) * x.size(1)), chunk = shard.chunk() * row;
  ops::copy_columns(r, 0, x, shard.first_start() * row, chunk, x.size(0));
  ops::copy_columns(r, chunk, x, shard.second_start() * row, chunk, x.size(0));
  return r;
}

Tensor shard_table_rows(const Tensor& table, const ContextShard& shard) {
  ZT_CHECK(table.ndim() >= 1 && table.size(0) >= shard.seq_len, "shard_table_rows: ", table.str(),
           " must be a table of at least seq_len = ", shard.seq_len, " rows");
  std::vector<int64_t> dims(table.shape().begin(), table.shape().end());
  dims[0] = shard.seq_len;
  dims.insert(dims.begin(), 1);
  const Tensor rows = shard_rows(table.slice(0, shard.seq_len).view(Shape(dims.begin(), dims.end())), shard);
  dims.erase(dims.begin());
  dims[0] = shard.local_len();
  return rows.view(Shape(dims.begin(), dims.end()));
}

void add_shard_table_rows(const Tensor& table, const Tensor& rows, const ContextShard& shard) {
  ZT_CHECK(table.dtype() == DType::f32 && rows.dtype() == DType::f32 && table.device() == rows.device() &&
               table.ndim() >= 1 && table.size(0) >= shard.seq_len && rows.ndim() == table.ndim() &&
               rows.size(0) == shard.local_len() &&
               rows.numel() == shard.local_len() * (table.numel() / table.size(0)),
           "add_shard_table_rows: rows ", rows.str(), " must be the ", shard.local_len(), " rows of table ",
           table.str(), " this cp rank holds (f32, on the table's device)");
  // The shard's two chunks are two runs of positions: one sum a run.
  const int64_t c = shard.chunk();
  ops::axpy(table.slice(shard.first_start(), shard.first_start() + c), 1.0f, rows.slice(0, c));
  ops::axpy(table.slice(shard.second_start(), shard.second_start() + c), 1.0f, rows.slice(c, 2 * c));
}

RingBuffers ring_attention_buffers(int64_t B, int64_t local_len, int64_t Hq, int64_t Hkv, int64_t D, DType dtype,
                                   int64_t cp) {
  if (cp <= 1) return {};
  // Elements of q, of k, of lse (f32); s bytes each in the compute dtype.
  const int64_t Q = B * local_len * Hq * D, K = B * local_len * Hkv * D, L = B * Hq * local_len;
  const int64_t s = dtype_size(dtype);
  // As ring_attention_forward allocates: part, part_lse, acc (f32), q's
  // second chunk and part2, part2_lse; kc, vc (half of k, v each).
  const int64_t forward_workspace = Q * s + 4 * L + 4 * Q + Q * s + 2 * L + K * s;
  // ring_attention_backward: dq/dk/dv_all, the halves, dq_acc (f32), q2,
  // dout2, out2, lse2; kc, vc.
  const int64_t backward_workspace = (Q + 2 * K) * s + (Q + 2 * K) * s / 2 + 4 * Q + 3 * Q * s / 2 + 2 * L + K * s;
  // The backward's comm: the forward's two k and v receive slots, two f32
  // dk and dv sum slots, and the rank's own f32 dk and dv.
  return {2 * 2 * K * s + 2 * 2 * 4 * K + 2 * 4 * K, std::max(forward_workspace, backward_workspace)};
}

void ring_attention_forward(comm::ProcessGroup& cp, const Tensor& out, const Tensor& lse, const Tensor& q,
                            const Tensor& k, const Tensor& v, float scale) {
  const char* op = "ring_attention_forward";
  check_local(op, cp, q, k, v, out, lse, {});
  const int P = cp.size(), r = cp.rank();
  if (P == 1) {
    ops::attention_forward(out, lse, q, k, v, scale);
    return;
  }
  const int64_t B = q.size(0), Tl = q.size(1), Hq = q.size(2), D = q.size(3), c = Tl / 2;
  const auto none = ops::AttentionMask::none;
  const Device dev = q.device();

  RingSlots slot;
  for (int i = 0; i < 2; ++i) {
    slot.k[i] = Tensor::empty(k.shape(), k.dtype(), dev, MemCategory::comm);
    slot.v[i] = Tensor::empty(k.shape(), k.dtype(), dev, MemCategory::comm);
  }
  // The previous rank's k and v arrive while the own block computes.
  std::vector<comm::WorkHandle> pending = {pass_on(cp, k, slot.k[0], kTagK), pass_on(cp, v, slot.v[0], kTagV)};

  // The running result starts as the own block's (causal): out in f32, its
  // lse in the caller's lse, which the merges then update in place.
  const Tensor part = Tensor::empty(q.shape(), q.dtype(), dev, MemCategory::workspace);
  const Tensor part_lse = Tensor::empty(lse.shape(), DType::f32, dev, MemCategory::workspace);
  ops::attention_forward(part, lse, q, k, v, scale);
  const Tensor acc = f32_copy(part, MemCategory::workspace);

  const Tensor q_second = rows_of(q, c, c);
  const Tensor part2 = Tensor::empty(Shape{B, c, Hq, D}, q.dtype(), dev, MemCategory::workspace);
  const Tensor part2_lse = Tensor::empty(Shape{B, Hq, c}, DType::f32, dev, MemCategory::workspace);
  for (int s = 1; s < P; ++s) {
    const int cur = (s - 1) % 2, nxt = s % 2;
    // Slot cur holds rank r - s's block; slot nxt's last send has completed.
    wait_all(pending);
    if (s < P - 1)  // pass the block on, and receive the next one behind it
      pending = {pass_on(cp, slot.k[cur], slot.k[nxt], kTagK), pass_on(cp, slot.v[cur], slot.v[nxt], kTagV)};
    const int src = (r - s + P) % P;
    if (src < r) {  // every local query sees src's first chunk
      const Tensor kc = rows_of(slot.k[cur], 0, c), vc = rows_of(slot.v[cur], 0, c);
      ops::attention_forward(part, part_lse, q, kc, vc, scale, none);
      ops::attention_merge(acc, lse, part, part_lse, 0);
    } else {  // the local second chunk sees both of src's chunks
      ops::attention_forward(part2, part2_lse, q_second, slot.k[cur], slot.v[cur], scale, none);
      ops::attention_merge(acc, lse, part2, part2_lse, c);
    }
  }  // the last step passes nothing on: pending is empty
  ops::cast(out, acc);
}

void ring_attention_backward(comm::ProcessGroup& cp, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, float scale) {
  const char* op = "ring_attention_backward";
  check_local(op, cp, q, k, v, out, lse, {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dout", &dout}});
  ZT_CHECK(dq.shape() == q.shape() && dout.shape() == q.shape() && dk.shape() == k.shape() &&
               dv.shape() == k.shape(),
           op, ": dq ", dq.shape().str(), " and dout ", dout.shape().str(), " must be q's shape ", q.shape().str(),
           ", dk ", dk.shape().str(), " and dv ", dv.shape().str(), " k's ", k.shape().str());
  const int P = cp.size(), r = cp.rank();
  if (P == 1) {
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale);
    return;
  }
  const int64_t B = q.size(0), Tl = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3), c = Tl / 2;
  const auto none = ops::AttentionMask::none;
  const Device dev = q.device();
  const DType dt = q.dtype();

  RingSlots slot;
  for (int i = 0; i < 2; ++i) {
    slot.k[i] = Tensor::empty(k.shape(), dt, dev, MemCategory::comm);
    slot.v[i] = Tensor::empty(k.shape(), dt, dev, MemCategory::comm);
    slot.dk[i] = Tensor::empty(k.shape(), DType::f32, dev, MemCategory::comm);
    slot.dv[i] = Tensor::empty(k.shape(), DType::f32, dev, MemCategory::comm);
  }
  std::vector<comm::WorkHandle> kv = {pass_on(cp, k, slot.k[0], kTagK), pass_on(cp, v, slot.v[0], kTagV)};

  // A block's gradients in the compute dtype: all rows of q, k, v, or half of them.
  const Tensor dq_all = Tensor::empty(q.shape(), dt, dev, MemCategory::workspace);
  const Tensor dk_all = Tensor::empty(k.shape(), dt, dev, MemCategory::workspace);
  const Tensor dv_all = Tensor::empty(k.shape(), dt, dev, MemCategory::workspace);
  const Tensor dq_half = Tensor::empty(Shape{B, c, Hq, D}, dt, dev, MemCategory::workspace);
  const Tensor dk_half = Tensor::empty(Shape{B, c, Hkv, D}, dt, dev, MemCategory::workspace);
  const Tensor dv_half = Tensor::empty(Shape{B, c, Hkv, D}, dt, dev, MemCategory::workspace);

  // The own block (causal) starts dq and this rank's dk, dv (f32 sums), which
  // then go round the ring collecting every later rank's share.
  ops::attention_backward(dq_all, dk_all, dv_all, dout, q, k, v, out, lse, scale);
  const Tensor dq_acc = f32_copy(dq_all, MemCategory::workspace);
  const Tensor own_dk = f32_copy(dk_all, MemCategory::comm), own_dv = f32_copy(dv_all, MemCategory::comm);
  std::vector<comm::WorkHandle> grads = {pass_on(cp, own_dk, slot.dk[0], kTagDk),
                                         pass_on(cp, own_dv, slot.dv[0], kTagDv)};

  // The local second chunk's rows of q, dout, out, lse (for src > r).
  const Tensor q2 = rows_of(q, c, c), dout2 = rows_of(dout, c, c), out2 = rows_of(out, c, c);
  const Tensor lse2 = lse_rows_of(lse, c, c);
  for (int s = 1; s < P; ++s) {
    const int cur = (s - 1) % 2, nxt = s % 2;
    // Slot cur holds rank r - s's k, v and the gradient sums travelling with them.
    wait_all(kv);
    wait_all(grads);
    if (s < P - 1)
      kv = {pass_on(cp, slot.k[cur], slot.k[nxt], kTagK), pass_on(cp, slot.v[cur], slot.v[nxt], kTagV)};
    const int src = (r - s + P) % P;
    if (src < r) {  // every local query against src's first chunk
      const Tensor kc = rows_of(slot.k[cur], 0, c), vc = rows_of(slot.v[cur], 0, c);
      ops::attention_backward(dq_all, dk_half, dv_half, dout, q, kc, vc, out, lse, scale, none);
      add_rows(dq_acc, dq_all, 0);
      add_rows(slot.dk[cur], dk_half, 0);
      add_rows(slot.dv[cur], dv_half, 0);
    } else {  // the local second chunk against both of src's chunks
      ops::attention_backward(dq_half, dk_all, dv_all, dout2, q2, slot.k[cur], slot.v[cur], out2, lse2, scale, none);
      add_rows(dq_acc, dq_half, c);
      add_rows(slot.dk[cur], dk_all, 0);
      add_rows(slot.dv[cur], dv_all, 0);
    }
    // The sums on to the next rank; at s = P - 1 that is their own rank, and
    // this rank's own dk, dv arrive in slot nxt.
    grads = {pass_on(cp, slot.dk[cur], slot.dk[nxt], kTagDk), pass_on(cp, slot.dv[cur], slot.dv[nxt], kTagDv)};
  }  // the last step passed no k, v on: kv is empty
  wait_all(grads);
  const int home = (P - 1) % 2;
  ops::cast(dq, dq_acc);
  ops::cast(dk, slot.dk[home]);
  ops::cast(dv, slot.dv[home]);
}

}  // namespace zt::nn
