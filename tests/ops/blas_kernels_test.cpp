// The OpenBLAS kernels CPU products run match the instruction sets this CPU
// reports (backend/cpu/blas_kernels.h): a library that does not know the
// CPU's model would otherwise run generic SSE3 kernels several times slower.
#include "backend/cpu/blas_kernels.h"

#include <gtest/gtest.h>
#include <strings.h>

#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <string>

namespace zt {
namespace {

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (strcasecmp(name.c_str(), n) == 0) return true;
  return false;
}

TEST(BlasKernels, MatchThisCpusInstructionSets) {
  const cpu::BlasKernels& k = cpu::blas_kernels();
  std::cout << cpu::describe_blas_kernels() << "\n";
  if (k.in_use.empty()) GTEST_SKIP() << "not OpenBLAS with a run-time kernel choice";
  if (k.user_choice) GTEST_SKIP() << "OPENBLAS_CORETYPE chose the kernels";
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512cd");
  if (avx512) {
    EXPECT_TRUE(one_of(k.in_use, {"SkylakeX", "Cooperlake", "SapphireRapids"})) << k.in_use << " on an AVX-512 CPU";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_TRUE(one_of(k.in_use, {"Haswell", "Zen", "Excavator"})) << k.in_use << " on an AVX2 CPU";
  }
  // Replaced only when the library's pick fell short.
  if (k.replaced) EXPECT_NE(k.in_use, k.library_pick);
  // The variable used to make the choice is not left for child processes.
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);
}

}  // namespace
}  // namespace zt
