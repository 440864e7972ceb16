// Device tensors through a host group ("host staging"). An operation copies
// the device tensors it reads into host buffers and runs the host group's
// operation on those; the results reach the device tensors when the caller
// sees the operation complete (test() returns true, or wait() returns).
// Host tensors go straight to the host group, untouched.
//
// What it is for:
//   - point-to-point transfers of GPU tensors: NCCL has no tags, and the
//     pipeline posts receives ahead and relies on tag matching (the NCCL
//     group sends and receives GPU tensors through one of these);
//   - several processes on one GPU (NCCL refuses a GPU twice in one
//     communicator): parallel.comm_backend = mpi with train.device = cuda,
//     so every layout (TP, PP, DP, ZeRO) runs, and is tested, on one GPU.
// It is correct wherever the host group is, and slow: each operation waits
// on the host for its tensors' producers and crosses the host bus twice.
//
// Every device tensor must be on the device the copy function serves.
// Errors in the arguments come from the host group's checks (the host
// buffers have the device tensors' shapes and dtypes), the same on every rank.
// Counters (stats) are the host group's.
#pragma once

#include <functional>
#include <memory>

#include "comm/process_group.h"

namespace zt::comm {

// dst <- src, bytes between a device and the host, with ops::copy's contract:
// when it returns, a host destination holds the bytes and a host source may
// be reused. (comm/ sits below ops/, so whoever builds the group passes it.)
using DeviceCopy = std::function<void(const Tensor& dst, const Tensor& src)>;

std::unique_ptr<ProcessGroup> make_host_staged_group(std::unique_ptr<ProcessGroup> host, DeviceCopy copy);

}  // namespace zt::comm
