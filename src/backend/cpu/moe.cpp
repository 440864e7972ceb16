// CPU mixture-of-experts kernels (contract: ops/moe.h).
//
// Routing: per token, the softmax over E logits in f32 (max subtracted,
// f64-free: E is small and the terms are in (0, 1]); the top k by a partial
// selection that keeps the lower index on ties. Rows of tokens (C wide) are
// loaded to f32, summed over a token's k slots in slot order and rounded
// once to the output's dtype.
#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace zt::cpu {

namespace {

constexpr int64_t kParallelMin = int64_t(1) << 14;  // elements: below this one thread

template <typename T>
void gather_rows(T* xs, const T* x, const int32_t* order, int64_t R, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
  for (int64_t p = 0; p < R; ++p) std::copy_n(x + int64_t(order[p] / k) * C, C, xs + p * C);
}

// dx[t] (+)= sum_j dxs[where[t k + j]] over the kept slots (where >= 0).
template <typename T>
void gather_backward_rows(T* dx, const T* dxs, const int32_t* where, int64_t N, int64_t k, int64_t C,
                          bool accumulate) {
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      T* row = dx + t * C;
      for (int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        if (where[t * k + j] < 0) continue;  // dropped
        const T* src = dxs + int64_t(where[t * k + j]) * C;
        for (int64_t c = 0; c < C; ++c) acc[c] += to_float(src[c]);
      }
      for (int64_t c = 0; c < C; ++c) row[c] = from_float<T>(accumulate ? to_float(row[c]) + acc[c] : acc[c]);
    }
  }
}

// out[t] = residual[t] + sum_j w[t, j] ys[where[t k + j]] over the kept slots.
template <typename T>
void combine_rows(T* out, const T* ys, const float* w, const int32_t* where, const T* residual, int64_t N,
                  int64_t k, int64_t C) {
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        if (where[t * k + j] < 0) continue;  // dropped
        const T* y = ys + int64_t(where[t * k + j]) * C;
        const float wj = w[t * k + j];
        for (int64_t c = 0; c < C; ++c) acc[c] += wj * to_float(y[c]);
      }
      T* o = out + t * C;
      if (residual) {
        const T* r = residual + t * C;
        for (int64_t c = 0; c < C; ++c) o[c] = from_float<T>(to_float(r[c]) + acc[c]);
      } else {
        for (int64_t c = 0; c < C; ++c) o[c] = from_float<T>(acc[c]);
      }
    }
  }
}

template <typename T>
void combine_backward_rows(T* dys, float* dweight, const T* dout, const T* ys, const float* w, const int32_t* where,
                           int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static) if (N * k * C >= kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    const T* g = dout + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = where[t * k + j];
      if (p < 0) {  // dropped: no row, no gradient for its weight
        dweight[t * k + j] = 0.0f;
        continue;
      }
      const T* y = ys + p * C;
      T* dy = dys + p * C;
      const float wj = w[t * k + j];
      float dot = 0.0f;
      for (int64_t c = 0; c < C; ++c) {
        const float gc = to_float(g[c]);
        dot += gc * to_float(y[c]);
        dy[c] = from_float<T>(wj * gc);
      }
      dweight[t * k + j] = dot;
    }
  }
}

}  // namespace

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               bool normalize, const Tensor& lse, const Tensor& bias) {
  const int64_t N = logits.size(0), E = logits.size(1), k = choice.size(1);
  const float* l = logits.data<float>();
  float* p = probs.data<float>();
  int32_t* ch = choice.data<int32_t>();
  float* w = weight.data<float>();
  float* z = lse.defined() ? lse.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (N * E >= kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    const float* lt = l + t * E;
    float* pt = p + t * E;
    float mx = lt[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, lt[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (pt[e] = std::exp(lt[e] - mx));
    if (z) z[t] = mx + std::log(sum);
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < E; ++e) pt[e] *= inv;
    // Top k by repeated selection (k is small): the largest score (the
    // probability, plus the expert's bias) not yet taken, the lower index on
    // ties (strict >).
    const auto score = [&](int64_t e) { return b ? pt[e] + b[e] : pt[e]; };
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= ch[t * k + i] == e;
        if (!taken && (best < 0 || score(e) > score(best))) best = e;
      }
      ch[t * k + j] = int32_t(best);
      w[t * k + j] = pt[best];
      total += pt[best];
    }
    if (normalize)
      for (int64_t j = 0; j < k; ++j) w[t * k + j] /= total;
  }
}

void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        const Tensor& weight, bool normalize, const Tensor& aux_dprob, const Tensor& dlse) {
  const int64_t N = probs.size(0), E = probs.size(1), k = choice.size(1);
  const float* p = probs.data<float>();
  const float* dw = dweight.data<float>();
  const float* w = weight.data<float>();
  const int32_t* ch = choice.data<int32_t>();
  const float* aux = aux_dprob.defined() ? aux_dprob.data<float>() : nullptr;
  const float* dz = dlse.defined() ? dlse.data<float>() : nullptr;
  float* dl = dlogits.data<float>();
#pragma omp parallel
  {
    std::vector<float> dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* pt = p + t * E;
      for (int64_t e = 0; e < E; ++e) dp[e] = aux ? aux[e] : 0.0f;
      // w_j = p_j / S (S = sum of the chosen p): dp_j = (dw_j - sum_i dw_i w_i) / S.
      float dot = 0.0f, S = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        dot += dw[t * k + j] * w[t * k + j];
        S += pt[ch[t * k + j]];
      }
      for (int64_t j = 0; j < k; ++j)
        dp[ch[t * k + j]] += normalize ? (dw[t * k + j] - dot) / S : dw[t * k + j];
      // Softmax: dl_e = p_e (dp_e - sum_i p_i dp_i).
      float mean = 0.0f;
      for (int64_t e = 0; e < E; ++e) mean += pt[e] * dp[e];
      // A row's logsumexp has gradient p_e at logit e: dlse adds dz_t p_e.
      const float dzt = dz ? dz[t] : 0.0f;
      for (int64_t e = 0; e < E; ++e) dl[t * E + e] = pt[e] * (dp[e] - mean) + dzt * pt[e];
    }
  }
}

void moe_dispatch_plan(const Tensor& order, const Tensor& where, std::vector<int64_t>& offsets,
                       const Tensor& choice, int64_t E, int64_t capacity, std::vector<int64_t>* routed,
                       const std::vector<int64_t>& run_start, const std::vector<int64_t>& run_ahead) {
  const int64_t NK = choice.numel();
  const int32_t* ch = choice.data<int32_t>();
  // Which slots their experts keep: the first `capacity` of each expert's in
  // the routing call's order, counting from the slots ahead of each run.
  std::vector<int64_t> demand(static_cast<size_t>(E), 0), kept(static_cast<size_t>(E), 0);
  std::vector<uint8_t> keep(static_cast<size_t>(NK), 1);
  std::vector<int64_t> seen(static_cast<size_t>(E), 0);  // each expert's slots so far in the call
  for (size_t i = 0; i < run_start.size(); ++i) {
    const int64_t end = i + 1 < run_start.size() ? run_start[i + 1] : NK;
    std::copy_n(run_ahead.begin() + std::ptrdiff_t(i) * E, E, seen.begin());
    for (int64_t s = run_start[i]; s < end; ++s) {
      const size_t e = size_t(ch[s]);
      ++demand[e];
      keep[size_t(s)] = capacity < 0 || seen[e]++ < capacity;
      kept[e] += keep[size_t(s)];
    }
  }
  offsets.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) offsets[size_t(e + 1)] = offsets[size_t(e)] + kept[size_t(e)];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  int32_t* ord = order.data<int32_t>();
  int32_t* wh = where.data<int32_t>();
  std::fill(ord + offsets[size_t(E)], ord + NK, -1);
  for (int64_t s = 0; s < NK; ++s) {  // slot order within each expert: a stable counting sort
    if (!keep[size_t(s)]) {
      wh[s] = -1;
      continue;
    }
    const int64_t pos = next[size_t(ch[s])]++;
    ord[pos] = int32_t(s);
    wh[s] = int32_t(pos);
  }
  if (routed) *routed = std::move(demand);
}

void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& order, int64_t k) {
  const int64_t R = xs.size(0), C = xs.size(1);
  if (x.dtype() == DType::f32)
    gather_rows(xs.data<float>(), x.data<float>(), order.data<int32_t>(), R, k, C);
  else
    gather_rows(xs.data<bf16>(), x.data<bf16>(), order.data<int32_t>(), R, k, C);
}

void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& where, int64_t k, bool accumulate) {
  const int64_t N = dx.size(0), C = dx.size(1);
  if (dx.dtype() == DType::f32)
    gather_backward_rows(dx.data<float>(), dxs.data<float>(), where.data<int32_t>(), N, k, C, accumulate);
  else
    gather_backward_rows(dx.data<bf16>(), dxs.data<bf16>(), where.data<int32_t>(), N, k, C, accumulate);
}

void moe_combine(const Tensor& out, const Tensor& ys, const Tensor& weight, const Tensor& where,
                 const Tensor& residual) {
  const int64_t N = out.size(0), C = out.size(1), k = weight.size(1);
  if (out.dtype() == DType::f32)
    combine_rows(out.data<float>(), ys.data<float>(), weight.data<float>(), where.data<int32_t>(),
                 residual.defined() ? residual.data<float>() : nullptr, N, k, C);
  else
    combine_rows(out.data<bf16>(), ys.data<bf16>(), weight.data<float>(), where.data<int32_t>(),
                 residual.defined() ? residual.data<bf16>() : nullptr, N, k, C);
}

void moe_combine_backward(const Tensor& dys, const Tensor& dweight, const Tensor& dout, const Tensor& ys,
                          const Tensor& weight, const Tensor& where) {
  const int64_t N = dout.size(0), C = dout.size(1), k = weight.size(1);
  if (dout.dtype() == DType::f32)
    combine_backward_rows(dys.data<float>(), dweight.data<float>(), dout.data<float>(), ys.data<float>(),
                          weight.data<float>(), where.data<int32_t>(), N, k, C);
  else
    combine_backward_rows(dys.data<bf16>(), dweight.data<float>(), dout.data<bf16>(), ys.data<bf16>(),
                          weight.data<float>(), where.data<int32_t>(), N, k, C);
}

}  // namespace zt::cpu
