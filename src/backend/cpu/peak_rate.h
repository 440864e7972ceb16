// The CPU's achievable matmul rate, measured: the MFU denominator on a CPU.
#pragma once

namespace zt::cpu {

// GFLOP/s of OpenBLAS sgemm on a 1024^3 problem, best of a few runs lasting
// about `seconds` in total, with the current OpenMP thread count.
double measure_sgemm_gflops(double seconds = 0.3);

}  // namespace zt::cpu
