#include "backend/cpu/peak_rate.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/cpu/blas_kernels.h"

namespace zt::cpu {

double measure_sgemm_gflops(double seconds) {
  blas_kernels();  // the kernels products will run
  constexpr int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
  };
  run();  // warm-up: thread pool, page faults
  double best = 1e30, total = 0;
  while (total < seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return 2.0 * n * double(n) * n / best / 1e9;
}

}  // namespace zt::cpu
