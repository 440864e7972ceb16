// The peers every op benchmark is measured against, in the same run:
//   sgemm_gflops(M, N, K): this machine's OpenBLAS sgemm rate on that shape
//   peak_sgemm_gflops():   the sgemm rate on a large square problem
//   memcpy_gbps(bytes):    memcpy rate for a buffer of that size, counting
//                          bytes read + bytes written (2 x size)
// Each is measured once per process (cached) with the same thread count as
// the op under test. Register op benchmarks with ->UseRealTime(): rates are
// wall-clock, since the op runs on several OpenMP threads.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>

namespace zt::bench {

double sgemm_gflops(int64_t M, int64_t N, int64_t K);
double peak_sgemm_gflops();
double memcpy_gbps(size_t bytes);

// Sets the counters every op benchmark reports:
//   "GFLOP/s" (when flops > 0), "GB/s" (when bytes > 0), and "ratio" = the
//   achieved rate over the peer rate (peer_rate in the same unit).
void report(benchmark::State& state, double flops_per_iter, double bytes_per_iter, double peer_rate);

}  // namespace zt::bench
