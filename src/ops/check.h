// Argument validation shared by every op: each failed check throws zt::Error
// naming the op, the argument, and the shapes/dtypes/devices involved.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "core/tensor.h"

namespace zt::ops {

// `t` must be defined.
void check_defined(const char* op, const char* name, const Tensor& t);
// `t` must have exactly `shape`.
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& shape);
// `t` must have `ndim` dimensions.
void check_ndim(const char* op, const char* name, const Tensor& t, int ndim);
// `t`'s dtype must be one of `allowed`.
void check_dtype(const char* op, const char* name, const Tensor& t, std::initializer_list<DType> allowed);
// A compute dtype: f32 or bf16 on any device, f16 on CUDA devices (the CPU
// kernels compute in f32 or bf16 only).
void check_compute_dtype(const char* op, const char* name, const Tensor& t);
// Every defined tensor in `ts` must be on `device`.
void check_device(const char* op, Device device, std::initializer_list<std::pair<const char*, const Tensor*>> ts);
// Integer ids (tokens, targets) of an op running on `device` may be on that
// device or on the host: ids are validated on the host before anything is
// written, so host ids save a device-to-host copy (a sync) per call.
void check_ids_device(const char* op, const char* name, const Tensor& ids, Device device);
// Two tensors must have the same dtype.
void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b);
// Memory an op's arguments share, by address (so views of separately wrapped
// memory count too): true if two defined, non-empty tensors on one device
// have a byte in common.
bool bytes_overlap(const Tensor& a, const Tensor& b);
// `a` and `b` must have no byte in common.
void check_disjoint(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b);
// `a` may be exactly `b` (an op in place: the same first byte, element size
// and byte count) but must not otherwise share a byte with it.
void check_alias_or_disjoint(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                             const Tensor& b);
// No two of the tensors in `ts` may share a byte.
using NamedTensor = std::pair<const char*, const Tensor*>;
void check_all_disjoint(const char* op, std::initializer_list<NamedTensor> ts);
// `a` must share no byte with any of `others` (an output and the inputs).
void check_disjoint_from(const char* op, const char* name_a, const Tensor& a,
                         std::initializer_list<NamedTensor> others);
// True when the op must run its CUDA kernel: `device` is cuda:N and this
// build has the CUDA backend. Brings the device up on first use; when it does
// not exist the error names the op ("matmul: device cuda:3 requested, but
// this machine has 1 GPU(s) ..."). Always false in a build without CUDA.
bool use_cuda(const char* op, Device device);
// The op has no kernel for this device in this build.
[[noreturn]] void no_backend(const char* op, Device device);

}  // namespace zt::ops
