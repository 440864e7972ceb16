// Ring attention over the cp group (the layout and the schedule are in
// ring_attention.h). The blocks run through ops::attention_*; this file
// moves k, v (and their gradients) round the ring and merges the blocks.
#include "nn/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
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

// Local rows [t0, t0 + n) of x (B, T, H, D) (any dtype): a new contiguous tensor.
Tensor rows_of(const Tensor& x, int64_t t0, int64_t n) {
  const int64_t B = x.size(0), T = x.size(1);
  const size_t row = size_t(x.size(2) * x.size(3)) * dtype_size(x.dtype());
  Tensor r = Tensor::empty(Shape{B, n, x.size(2), x.size(3)}, x.dtype(), x.device(), MemCategory::workspace);
  auto* dst = static_cast<char*>(r.data_ptr());
  const auto* src = static_cast<const char*>(x.data_ptr());
  for (int64_t b = 0; b < B; ++b) std::memcpy(dst + size_t(b * n) * row, src + size_t(b * T + t0) * row, size_t(n) * row);
  return r;
}

// Rows [t0, t0 + n) of lse (B, H, T) f32 along its last dim: (B, H, n).
Tensor lse_rows_of(const Tensor& lse, int64_t t0, int64_t n) {
  const int64_t BH = lse.size(0) * lse.size(1), T = lse.size(2);
  Tensor r = Tensor::empty(Shape{lse.size(0), lse.size(1), n}, DType::f32, lse.device(), MemCategory::workspace);
  for (int64_t i = 0; i < BH; ++i)
    std::memcpy(r.data<float>() + i * n, lse.data<float>() + i * T + t0, size_t(n) * sizeof(float));
  return r;
}

Tensor f32_zeros(const Shape& shape, MemCategory category) {
  Tensor t = Tensor::empty(shape, DType::f32, Device::cpu(), category);
  ops::fill(t, 0.0);
  return t;
}

// acc (B, T, H, D) f32 rows [t0, t0 + n) += part (B, n, H, D).
template <typename T>
void add_rows(const Tensor& acc, const Tensor& part, int64_t t0) {
  const int64_t B = part.size(0), n = part.size(1), row = part.size(2) * part.size(3), Tacc = acc.size(1);
  const T* p = part.data<T>();
  float* a = acc.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    float* dst = a + (b * Tacc + t0) * row;
    const T* src = p + b * n * row;
#pragma omp simd
    for (int64_t i = 0; i < n * row; ++i) dst[i] += to_float(src[i]);
  }
}

// The merge of a block's partial (out_b (B, n, Hq, D), lse_b (B, Hq, n)) into
// the f32 running (out (B, T, Hq, D), lse (B, Hq, T)) at rows [t0, t0 + n).
// A running lse of -inf (nothing merged yet) takes the block as it is.
template <typename T>
void merge_rows(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t t0) {
  const int64_t B = out_b.size(0), n = out_b.size(1), H = out_b.size(2), D = out_b.size(3), Tall = out.size(1);
  const T* ob = out_b.data<T>();
  const float* lb = lse_b.data<float>();
  float* o = out.data<float>();
  float* l = lse.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) {
        float& run = l[(b * H + h) * Tall + t0 + i];
        const float blk = lb[(b * H + h) * n + i];
        const float hi = std::max(run, blk);
        const float merged = hi + std::log1p(std::exp(std::min(run, blk) - hi));  // log(e^run + e^blk)
        const float w_run = std::exp(run - merged), w_blk = std::exp(blk - merged);
        float* dst = o + ((b * Tall + t0 + i) * H + h) * D;
        const T* src = ob + ((b * n + i) * H + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dst[d] = w_run * dst[d] + w_blk * to_float(src[d]);
        run = merged;
      }
}

template <typename Fn>
void by_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) {
    fn(bf16{});
  } else {
    fn(float{});
  }
}

// What both directions check before the first message, so a bad call fails
// on the rank that made it instead of leaving its peers waiting: the local
// shapes, one float dtype, CPU tensors, 2c rows.
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
  ZT_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16, op, ": q is ", dtype_name(q.dtype()),
           "; ring attention runs on f32 or bf16");
  std::vector<std::pair<const char*, const Tensor*>> all = {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}};
  all.insert(all.end(), more.begin(), more.end());
  for (const auto& [name, t] : all) {
    ZT_CHECK(t->dtype() == q.dtype(), op, ": '", name, "' is ", dtype_name(t->dtype()), " but q is ",
             dtype_name(q.dtype()), "; pass them all in one dtype");
    ZT_CHECK(t->device().is_cpu(), op, ": '", name, "' is on ", t->device().str(),
             "; context parallelism runs on the CPU so far (parallel.cp > 1 needs CPU tensors)");
  }
  ZT_CHECK(lse.device().is_cpu(), op, ": 'lse' is on ", lse.device().str(), "; context parallelism runs on the CPU");
}

// Two alternating receive buffers of the ring, each with the sends that
// forward it (it is refilled only once they have completed).
struct RingSlot {
  Tensor k, v, dk, dv;
  std::vector<comm::WorkHandle> sends;
  void wait_sends() {
    for (auto& w : sends) w->wait();
    sends.clear();
  }
};

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
  // Per sequence: its first chunk's rows, then its second's (bytes of one row: `row`).
  const size_t row = size_t(x.numel() / (x.size(0) * x.size(1))) * dtype_size(x.dtype());
  const size_t chunk = size_t(shard.chunk()) * row;
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(r.data_ptr());
  for (int64_t b = 0; b < x.size(0); ++b) {
    const char* seq = src + size_t(b * shard.seq_len) * row;
    std::memcpy(dst + size_t(b) * 2 * chunk, seq + size_t(shard.first_start()) * row, chunk);
    std::memcpy(dst + size_t(b) * 2 * chunk + chunk, seq + size_t(shard.second_start()) * row, chunk);
  }
  return r;
}

Tensor shard_table_rows(const Tensor& table, const ContextShard& shard) {
  ZT_CHECK(table.ndim() >= 1 && table.size(0) >= shard.seq_len && table.device().is_cpu(), "shard_table_rows: ",
           table.str(), " must be a CPU table of at least seq_len = ", shard.seq_len, " rows");
  std::vector<int64_t> dims(table.shape().begin(), table.shape().end());
  dims[0] = shard.seq_len;
  dims.insert(dims.begin(), 1);
  const Tensor rows = shard_rows(table.slice(0, shard.seq_len).view(Shape(dims.begin(), dims.end())), shard);
  dims.erase(dims.begin());
  dims[0] = shard.local_len();
  return rows.view(Shape(dims.begin(), dims.end()));
}

void add_shard_table_rows(const Tensor& table, const Tensor& rows, const ContextShard& shard) {
  ZT_CHECK(table.dtype() == DType::f32 && rows.dtype() == DType::f32 && table.device().is_cpu() &&
               rows.device().is_cpu() && table.ndim() >= 1 && table.size(0) >= shard.seq_len &&
               rows.ndim() == table.ndim() && rows.size(0) == shard.local_len() &&
               rows.numel() == shard.local_len() * (table.numel() / table.size(0)),
           "add_shard_table_rows: rows ", rows.str(), " must be the ", shard.local_len(), " rows of table ",
           table.str(), " this cp rank holds (f32, CPU)");
  const int64_t inner = rows.numel() / rows.size(0);
  float* t = table.data<float>();
  const float* r = rows.data<float>();
  for (int64_t i = 0; i < shard.local_len(); ++i) {
    float* dst = t + shard.position(i) * inner;
    const float* src = r + i * inner;
#pragma omp simd
    for (int64_t j = 0; j < inner; ++j) dst[j] += src[j];
  }
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
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  const int64_t B = q.size(0), Tl = q.size(1), Hq = q.size(2), D = q.size(3), c = Tl / 2;
  const auto none = ops::AttentionMask::none;

  std::vector<comm::WorkHandle> own_sends = {cp.send(k, next, kTagK), cp.send(v, next, kTagV)};
  RingSlot slot[2];
  for (RingSlot& s : slot) {
    s.k = Tensor::empty(k.shape(), k.dtype(), Device::cpu(), MemCategory::comm);
    s.v = Tensor::empty(k.shape(), k.dtype(), Device::cpu(), MemCategory::comm);
  }
  std::vector<comm::WorkHandle> recvs = {cp.recv(slot[0].k, prev, kTagK), cp.recv(slot[0].v, prev, kTagV)};

  // The running result: f32 out, lse from -inf.
  const Tensor acc = f32_zeros(q.shape(), MemCategory::workspace);
  const Tensor acc_lse = Tensor::empty(lse.shape(), DType::f32, Device::cpu(), MemCategory::workspace);
  ops::fill(acc_lse, -std::numeric_limits<double>::infinity());
  Tensor part = Tensor::empty(q.shape(), q.dtype(), Device::cpu(), MemCategory::workspace);
  Tensor part_lse = Tensor::empty(lse.shape(), DType::f32, Device::cpu(), MemCategory::workspace);
  ops::attention_forward(part, part_lse, q, k, v, scale);  // the own block: causal
  by_dtype(q.dtype(), [&](auto t) { merge_rows<decltype(t)>(acc, acc_lse, part, part_lse, 0); });

  const Tensor q_second = rows_of(q, c, c);
  const Tensor part2 = Tensor::empty(Shape{B, c, Hq, D}, q.dtype(), Device::cpu(), MemCategory::workspace);
  const Tensor part2_lse = Tensor::empty(Shape{B, Hq, c}, DType::f32, Device::cpu(), MemCategory::workspace);
  for (int s = 1; s < P; ++s) {
    RingSlot& cur = slot[(s - 1) % 2];
    wait_all(recvs);
    if (s < P - 1) {  // pass the block on, and receive the next one behind it
      cur.sends = {cp.send(cur.k, next, kTagK), cp.send(cur.v, next, kTagV)};
      RingSlot& nxt = slot[s % 2];
      nxt.wait_sends();
      recvs = {cp.recv(nxt.k, prev, kTagK), cp.recv(nxt.v, prev, kTagV)};
    }
    const int src = (r - s + P) % P;
    if (src < r) {  // every local query sees src's first chunk
      const Tensor kc = rows_of(cur.k, 0, c), vc = rows_of(cur.v, 0, c);
      ops::attention_forward(part, part_lse, q, kc, vc, scale, none);
      by_dtype(q.dtype(), [&](auto t) { merge_rows<decltype(t)>(acc, acc_lse, part, part_lse, 0); });
    } else {  // the local second chunk sees both of src's chunks
      ops::attention_forward(part2, part2_lse, q_second, cur.k, cur.v, scale, none);
      by_dtype(q.dtype(), [&](auto t) { merge_rows<decltype(t)>(acc, acc_lse, part2, part2_lse, c); });
    }
  }
  wait_all(own_sends);
  for (RingSlot& s : slot) s.wait_sends();
  ops::cast(out, acc);
  ops::copy(lse, acc_lse);
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
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  const int64_t B = q.size(0), Tl = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3), c = Tl / 2;
  const auto none = ops::AttentionMask::none;
  const DType dt = q.dtype();
  auto add = [&](const Tensor& acc, const Tensor& part, int64_t t0) {
    by_dtype(dt, [&](auto t) { add_rows<decltype(t)>(acc, part, t0); });
  };

  std::vector<comm::WorkHandle> own_sends = {cp.send(k, next, kTagK), cp.send(v, next, kTagV)};
  RingSlot slot[2];
  for (RingSlot& s : slot) {
    s.k = Tensor::empty(k.shape(), dt, Device::cpu(), MemCategory::comm);
    s.v = Tensor::empty(k.shape(), dt, Device::cpu(), MemCategory::comm);
    s.dk = Tensor::empty(k.shape(), DType::f32, Device::cpu(), MemCategory::comm);
    s.dv = Tensor::empty(k.shape(), DType::f32, Device::cpu(), MemCategory::comm);
  }
  std::vector<comm::WorkHandle> recvs = {cp.recv(slot[0].k, prev, kTagK), cp.recv(slot[0].v, prev, kTagV),
                                         cp.recv(slot[0].dk, prev, kTagDk), cp.recv(slot[0].dv, prev, kTagDv)};

  // The own block (causal) starts dq and this rank's dk, dv, which then go
  // round the ring collecting every later rank's share.
  const Tensor dq_acc = f32_zeros(q.shape(), MemCategory::workspace);
  const Tensor own_dk = f32_zeros(k.shape(), MemCategory::comm), own_dv = f32_zeros(k.shape(), MemCategory::comm);
  {
    Tensor dq_p = Tensor::empty(q.shape(), dt, Device::cpu(), MemCategory::workspace);
    Tensor dk_p = Tensor::empty(k.shape(), dt, Device::cpu(), MemCategory::workspace);
    Tensor dv_p = Tensor::empty(k.shape(), dt, Device::cpu(), MemCategory::workspace);
    ops::attention_backward(dq_p, dk_p, dv_p, dout, q, k, v, out, lse, scale);
    add(dq_acc, dq_p, 0);
    add(own_dk, dk_p, 0);
    add(own_dv, dv_p, 0);
  }
  own_sends.push_back(cp.send(own_dk, next, kTagDk));
  own_sends.push_back(cp.send(own_dv, next, kTagDv));

  // The local second chunk's rows of q, dout, out, lse (for src > r).
  const Tensor q2 = rows_of(q, c, c), dout2 = rows_of(dout, c, c), out2 = rows_of(out, c, c);
  const Tensor lse2 = lse_rows_of(lse, c, c);
  const Tensor dq_all = Tensor::empty(q.shape(), dt, Device::cpu(), MemCategory::workspace);
  const Tensor dq_half = Tensor::empty(Shape{B, c, Hq, D}, dt, Device::cpu(), MemCategory::workspace);
  const Tensor dk_half = Tensor::empty(Shape{B, c, Hkv, D}, dt, Device::cpu(), MemCategory::workspace);
  const Tensor dv_half = Tensor::empty(Shape{B, c, Hkv, D}, dt, Device::cpu(), MemCategory::workspace);
  const Tensor dk_all = Tensor::empty(k.shape(), dt, Device::cpu(), MemCategory::workspace);
  const Tensor dv_all = Tensor::empty(k.shape(), dt, Device::cpu(), MemCategory::workspace);
  for (int s = 1; s <= P; ++s) {
    RingSlot& cur = slot[(s - 1) % 2];
    wait_all(recvs);
    if (s == P) break;  // cur holds this rank's own dk, dv, home after going round
    RingSlot& nxt = slot[s % 2];
    if (s < P - 1) cur.sends = {cp.send(cur.k, next, kTagK), cp.send(cur.v, next, kTagV)};
    nxt.wait_sends();
    if (s < P - 1) recvs = {cp.recv(nxt.k, prev, kTagK), cp.recv(nxt.v, prev, kTagV)};
    recvs.push_back(cp.recv(nxt.dk, prev, kTagDk));  // the next block's gradients, or at s = P - 1 our own
    recvs.push_back(cp.recv(nxt.dv, prev, kTagDv));

    const int src = (r - s + P) % P;
    if (src < r) {  // every local query against src's first chunk
      const Tensor kc = rows_of(cur.k, 0, c), vc = rows_of(cur.v, 0, c);
      ops::attention_backward(dq_all, dk_half, dv_half, dout, q, kc, vc, out, lse, scale, none);
      add(dq_acc, dq_all, 0);
      add(cur.dk, dk_half, 0);
      add(cur.dv, dv_half, 0);
    } else {  // the local second chunk against both of src's chunks
      ops::attention_backward(dq_half, dk_all, dv_all, dout2, q2, cur.k, cur.v, out2, lse2, scale, none);
      add(dq_acc, dq_half, c);
      add(cur.dk, dk_all, 0);
      add(cur.dv, dv_all, 0);
    }
    cur.sends.push_back(cp.send(cur.dk, next, kTagDk));
    cur.sends.push_back(cp.send(cur.dv, next, kTagDv));
  }
  const RingSlot& home = slot[(P - 1) % 2];
  ops::cast(dq, dq_acc);
  ops::cast(dk, home.dk);
  ops::cast(dv, home.dv);
  wait_all(own_sends);
  for (RingSlot& s : slot) s.wait_sends();
}

}  // namespace zt::nn
