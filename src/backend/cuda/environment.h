// Every ZT_CUDA_* and ZT_CUDNN_* tuning switch read and checked at once:
// each is read on first use otherwise, which in training is the first call
// of its kernel - after the model is built and the data loaded, minutes into
// a job (or a short GPU lease) for a typo. ops::init_device calls it before
// it touches a GPU, so a bad value fails the same way with or without one.
#pragma once

namespace zt::cuda {

// Throws zt::Error naming the first bad variable, its value and the fix.
void read_environment();

}  // namespace zt::cuda
