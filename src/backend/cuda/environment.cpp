// The CUDA backend's switches read at once (backend/cuda/environment.h).
#include "backend/cuda/environment.h"

#include "backend/cuda/attention.h"
#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/kernel_race.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/norm.h"

namespace zt::cuda {

void read_environment() {
  (void)kernel_races_on();
  (void)pinned_classifier_kernel();
  (void)pinned_norm_backward();
  read_attention_environment();
  read_matmul_environment();
}

}  // namespace zt::cuda
