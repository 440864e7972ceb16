#include "backend/cpu/blas_kernels.h"

#include <strings.h>

#include <cstdlib>
#include <initializer_list>

// OpenBLAS's own entry points (exported by its shared library). Weak: a BLAS
// without them (another library, or OpenBLAS built for one CPU) leaves the
// addresses null and the check does nothing.
extern "C" {
char* openblas_get_corename(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace zt::cpu {

namespace {

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (strcasecmp(name.c_str(), n) == 0) return true;
  return false;
}

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
}

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

BlasKernels check() {
  BlasKernels k;
  if (openblas_get_corename == nullptr) return k;
  k.library_pick = k.in_use = openblas_get_corename();
  k.user_choice = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  if (k.user_choice || gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return k;
  if (kernels_fit_this_cpu(k.library_pick)) return k;
  const char* better = has_avx512() ? "SkylakeX" : "Haswell";
  // Re-run the library's selection with the choice it reads from the
  // environment; nothing has run a product yet, so no buffers or threads
  // hold the old kernels. The variable is removed again, so that programs
  // this one starts make their own check.
  setenv("OPENBLAS_CORETYPE", better, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  k.in_use = openblas_get_corename();
  k.replaced = k.in_use != k.library_pick;
  return k;
}

}  // namespace

bool kernels_fit_this_cpu(const std::string& kernels) {
  if (has_avx512()) return one_of(kernels, {"SkylakeX", "Cooperlake", "SapphireRapids"});
  if (has_avx2()) return one_of(kernels, {"Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"});
  return true;
}

const BlasKernels& blas_kernels() {
  static const BlasKernels k = check();
  return k;
}

std::string describe_blas_kernels() {
  const BlasKernels& k = blas_kernels();
  if (k.in_use.empty()) return "not OpenBLAS with run-time kernel choice";
  std::string s = "OpenBLAS " + k.in_use + " kernels";
  if (k.replaced) s += " (OpenBLAS picked " + k.library_pick + ", which this CPU's instruction sets outgrow)";
  if (k.user_choice) s += " (OPENBLAS_CORETYPE)";
  return s;
}

}  // namespace zt::cpu
