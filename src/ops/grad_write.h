// How an op writes a parameter gradient it computes: added into what the
// tensor holds (several micro-batches, or several contributions in one), or
// written over it without reading it - a step's first write, which then
// needs no zero-fill before it (nn::ParamSet::claim_grads decides which).
// Both give the same bits: x is 0 + x exactly (but for the sign of a zero).
#pragma once

namespace zt::ops {

enum class GradWrite { accumulate, overwrite };

}  // namespace zt::ops
