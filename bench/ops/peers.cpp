#include "ops/peers.h"

#include <cblas.h>
#include <cstdint>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace zt::bench {

namespace {

// Runs fn repeatedly for at least min_seconds (after one warm-up call) and
// returns the best seconds per call over 3 such rounds.
template <typename Fn>
double best_seconds_per_call(Fn&& fn, double min_seconds = 0.2) {
  fn();
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    int calls = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (elapsed < min_seconds / 3);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

std::mutex g_mu;

}  // namespace

double sgemm_gflops(int64_t M, int64_t N, int64_t K) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  std::lock_guard<std::mutex> lock(g_mu);
  auto key = std::make_tuple(M, N, K);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<float> a(size_t(M * K), 0.5f), b(size_t(K * N), 0.25f), c(size_t(M * N));
  const double s = best_seconds_per_call([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f, a.data(), int(K),
                b.data(), int(N), 0.0f, c.data(), int(N));
  });
  const double rate = 2.0 * double(M) * double(N) * double(K) / s / 1e9;
  cache[key] = rate;
  return rate;
}

double peak_sgemm_gflops() { return sgemm_gflops(2048, 2048, 2048); }

double memcpy_gbps(size_t bytes) {
  static std::map<size_t, double> cache;
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double s = best_seconds_per_call([&] {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  });
  const double rate = 2.0 * double(bytes) / s / 1e9;
  cache[bytes] = rate;
  return rate;
}

void report(benchmark::State& state, double flops_per_iter, double bytes_per_iter, double peer_rate) {
  const auto iters = double(state.iterations());
  if (flops_per_iter > 0) {
    state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * iters / 1e9, benchmark::Counter::kIsRate);
  }
  if (bytes_per_iter > 0) {
    state.counters["GB/s"] = benchmark::Counter(bytes_per_iter * iters / 1e9, benchmark::Counter::kIsRate);
  }
  // "ratio" is achieved rate / peer rate; benchmark divides kIsRate counters
  // by elapsed seconds, so express it as (units per iteration / peer) as a rate.
  const double units = flops_per_iter > 0 ? flops_per_iter : bytes_per_iter;
  state.counters["peer"] = peer_rate;
  state.counters["ratio"] = benchmark::Counter(units * iters / 1e9 / peer_rate, benchmark::Counter::kIsRate);
}

}  // namespace zt::bench
