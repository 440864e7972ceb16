// Which OpenBLAS kernels the CPU products run, and a fix for a stale pick.
//
// OpenBLAS (DYNAMIC_ARCH builds, as Debian's) picks its kernels by CPU model
// when it loads. A model newer than the library falls back to generic SSE3
// kernels: Debian 12's 0.3.21 on an Intel Xeon of model 207 (Emerald Rapids,
// with AVX-512) says "Prescott", and sgemm ran at 30 GFLOP/s on two cores
// instead of 244 with its SkylakeX kernels. Before the first product, the
// pick is checked against the instruction sets the CPU reports, and a
// weaker one is replaced by the best kernels those sets allow (SkylakeX for
// AVX-512, Haswell for AVX2 + FMA). OPENBLAS_CORETYPE in the environment is
// the user's choice and is kept.
#pragma once

#include <string>

namespace zt::cpu {

struct BlasKernels {
  std::string library_pick;  // what OpenBLAS chose at load ("" when not OpenBLAS with DYNAMIC_ARCH)
  std::string in_use;        // the kernels products run now
  bool replaced = false;     // in_use is Zettatron's choice, not library_pick
  bool user_choice = false;  // OPENBLAS_CORETYPE was set
};

// Checks once (the first call; matmul.cpp calls it while the process starts,
// before any thread runs a product) and reports.
const BlasKernels& blas_kernels();

// True when OpenBLAS kernels of this name use what this CPU's instruction
// sets offer (AVX-512: the SkylakeX family; AVX2 + FMA: Haswell, Zen,
// Excavator or better; any kernels on older CPUs).
bool kernels_fit_this_cpu(const std::string& kernels);

// The kernels in one phrase, e.g. "OpenBLAS SkylakeX kernels (OpenBLAS
// picked Prescott, which this CPU's instruction sets outgrow)".
std::string describe_blas_kernels();

}  // namespace zt::cpu
