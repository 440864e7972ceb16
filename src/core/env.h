// Tuning overrides read from the environment (ZT_CUDA_WGRAD_CHUNKS,
// ZT_CUDNN_FORWARD_CONFIG, ZT_HEAD_CHUNK_ELEMS, ZT_FUSED_QKV, ...): each read where it
// applies, all validated alike, so a typo is an error that names the
// variable instead of a silent default.
#pragma once

#include <cstdint>
#include <optional>

namespace zt {

// The whole number in environment variable `name`; nothing when it is unset
// or empty. A value that is not a whole number >= `least` throws zt::Error
// naming the variable, its value, `what` it sets, and that unsetting it
// restores the default.
std::optional<int64_t> env_whole_number(const char* name, int64_t least, const char* what);

// An on/off switch in environment variable `name`: 1 on, 0 off, unset or
// empty `unset`; anything else throws zt::Error as env_whole_number does.
bool env_switch(const char* name, const char* what, bool unset = false);

}  // namespace zt
