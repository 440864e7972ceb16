// Rotary position embedding on the CPU, Meta's interleaved-pair convention.
//
// Forward, pair i of a head at position p (angle a = p freq_i, c = cos a,
// s = sin a):
//   y[2i]   = x[2i] c - x[2i+1] s
//   y[2i+1] = x[2i] s + x[2i+1] c          (y = R x, R a rotation)
// Gradient: the map is linear and orthogonal, so dx = R^T dy, the rotation
// by -a:
//   dx[2i]   =  dy[2i] c + dy[2i+1] s
//   dx[2i+1] = -dy[2i] s + dy[2i+1] c
// Both are one kernel with the sign of s flipped. Math in f32 (bf16 widened,
// rounded once); in place is safe since each pair is read before it is
// written. Parallel over (b, t) rows; memory-bound.
#include "backend/cpu/rope.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zt::cpu {

void rope_table(const Tensor& table, const double* freqs) {
  const int64_t T_max = table.size(0), half = table.size(1);
  float* tp = table.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T_max; ++t) {
    float* row = tp + t * half * 2;
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t) * freqs[i];
      row[2 * i] = float(std::cos(a));
      row[2 * i + 1] = float(std::sin(a));
    }
  }
}

namespace {

// Rows of (B, T) tokens, each Hq + 2 Hkv (+ skipped) heads of D channels in
// `packed` and Hq (q), Hkv (k), Hkv (v) heads in the separate tensors. Heads
// [0, Hq + Hkv) are rotated (by -angle when `inverse`), the next Hkv copied
// (all copied without a table), a token's last `skipped` heads not visited;
// to_packed: from the separate tensors into packed, else the other way.
// A plain rotation is Hkv = 0 (k and v unused), in place when q == packed
// (then q shares packed's layout: a fused product's query and key heads
// rotated in place are Hq + Hkv heads with the Hkv value heads skipped).
template <typename T>
struct HeadLayout {
  T* packed;
  T* q;
  T* k;
  T* v;
  int64_t Hq, Hkv;
  int64_t skipped = 0;
};

template <typename T>
void rotate_heads(const HeadLayout<T>& l, int64_t rows, int64_t T_, int64_t D, const Tensor& table,
                  int64_t pos_offset, bool inverse, bool to_packed) {
  const int64_t half = D / 2, H = l.Hq + 2 * l.Hkv, rotated = table.defined() ? l.Hq + l.Hkv : 0;
  const int64_t token_heads = H + l.skipped;  // packed's heads per token
  const float* tp = table.defined() ? table.data<float>() : nullptr;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < rows; ++bt) {
    const int64_t t = bt % T_;
    const float* cs = tp ? tp + (t + pos_offset) * half * 2 : nullptr;  // (cos, sin) pairs
    for (int64_t h = 0; h < H; ++h) {
      T* pk = l.packed + (bt * token_heads + h) * D;
      T* sep = l.q == l.packed   ? pk
               : h < l.Hq        ? l.q + (bt * l.Hq + h) * D
               : h < l.Hq + l.Hkv ? l.k + (bt * l.Hkv + h - l.Hq) * D
                                  : l.v + (bt * l.Hkv + h - l.Hq - l.Hkv) * D;
      const T* src = to_packed ? sep : pk;
      T* dst = to_packed ? pk : sep;  // may equal src
      if (h >= rotated) {
        std::memcpy(dst, src, size_t(D) * sizeof(T));  // not rotated: disjoint tensors (ops checked)
        continue;
      }
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = sign * cs[2 * i + 1];
        const float x0 = to_float(src[2 * i]), x1 = to_float(src[2 * i + 1]);
        dst[2 * i] = from_float<T>(x0 * c - x1 * s);
        dst[2 * i + 1] = from_float<T>(x0 * s + x1 * c);
      }
    }
  }
}

template <typename T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void rope_rotate(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse) {
  const int64_t rows = x.size(0) * x.size(1), T_ = x.size(1), H = x.size(2), D = x.size(3);
  if (x.dtype() == DType::bf16) {
    rotate_heads<bf16>({ptr<bf16>(x), ptr<bf16>(y), nullptr, nullptr, H, 0}, rows, T_, D, table, pos_offset, inverse,
                       false);
  } else {
    rotate_heads<float>({ptr<float>(x), ptr<float>(y), nullptr, nullptr, H, 0}, rows, T_, D, table, pos_offset,
                        inverse, false);
  }
}

void rope_packed_qkv(const Tensor& qkv, int64_t Hq, int64_t Hkv, const Tensor& table, int64_t pos_offset,
                     bool inverse) {
  const int64_t rows = qkv.size(0) * qkv.size(1), T_ = qkv.size(1), D = qkv.size(3);
  if (qkv.dtype() == DType::bf16) {
    rotate_heads<bf16>({ptr<bf16>(qkv), ptr<bf16>(qkv), nullptr, nullptr, Hq + Hkv, 0, Hkv}, rows, T_, D, table,
                       pos_offset, inverse, false);
  } else {
    rotate_heads<float>({ptr<float>(qkv), ptr<float>(qkv), nullptr, nullptr, Hq + Hkv, 0, Hkv}, rows, T_, D, table,
                        pos_offset, inverse, false);
  }
}

void rope_split_qkv(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& table,
                    int64_t pos_offset, bool backward) {
  const int64_t rows = q.size(0) * q.size(1), T_ = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3);
  if (q.dtype() == DType::bf16) {
    rotate_heads<bf16>({ptr<bf16>(qkv), ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), Hq, Hkv}, rows, T_, D, table,
                       pos_offset, backward, backward);
  } else {
    rotate_heads<float>({ptr<float>(qkv), ptr<float>(q), ptr<float>(k), ptr<float>(v), Hq, Hkv}, rows, T_, D, table,
                        pos_offset, backward, backward);
  }
}

}  // namespace zt::cpu
