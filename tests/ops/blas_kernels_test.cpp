// The OpenBLAS kernels CPU products run match the instruction sets this CPU
// reports (backend/cpu/blas_kernels.h): a library that does not know the
// CPU's model would otherwise run generic SSE3 kernels several times slower.
#include "backend/cpu/blas_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace zt {
namespace {

TEST(BlasKernels, MatchThisCpusInstructionSets) {
  const cpu::BlasKernels& k = cpu::blas_kernels();
  std::cout << cpu::describe_blas_kernels() << "\n";
  if (k.in_use.empty()) GTEST_SKIP() << "not OpenBLAS with a run-time kernel choice";
  if (k.user_choice) GTEST_SKIP() << "OPENBLAS_CORETYPE chose the kernels";
  EXPECT_TRUE(cpu::kernels_fit_this_cpu(k.in_use)) << k.in_use << " kernels leave this CPU's instruction sets unused";
  // Replaced exactly when the library's pick fell short.
  EXPECT_EQ(k.replaced, !cpu::kernels_fit_this_cpu(k.library_pick)) << "OpenBLAS picked " << k.library_pick;
  // The variable used to make the choice is not left for child processes.
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);
}

// The table itself: the names OpenBLAS gives its kernels, graded against
// this CPU (the library's generic pick never fits a CPU with AVX2).
TEST(BlasKernels, GenericKernelsNeverFitAnAvx2Cpu) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "no AVX2 + FMA";
  for (const char* old : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Katmai"})
    EXPECT_FALSE(cpu::kernels_fit_this_cpu(old)) << old;
  EXPECT_TRUE(cpu::kernels_fit_this_cpu("SkylakeX"));
  EXPECT_TRUE(cpu::kernels_fit_this_cpu("skylakex")) << "OpenBLAS compares names without case";
}

}  // namespace
}  // namespace zt
