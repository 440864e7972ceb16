// The NCCL backend of ProcessGroup: GPU tensors are reduced and moved by
// NCCL on the device's communication stream; host tensors go to a group over
// the same processes (MPI, or solo for one process), which also carries
// NCCL's unique id at creation. So one group serves both: a data-parallel
// gradient bucket on the GPU and the host scalars of the metrics.
//
// Ordering without host synchronisation: an operation on GPU tensors first
// makes the communication stream wait for everything queued so far on the
// compute stream (the tensors' producers); Work::wait() makes the compute
// stream wait for the operation - the host does not block, kernels queued
// after wait() see the result, and a tensor freed after wait() is reused
// only after the operation (the caching allocator orders reuse by the
// compute stream). Work::test() asks the operation's event.
//
// Each GPU operation is timed on the device (events before and after it):
// busy_seconds is its GPU time, counted once it is seen complete (stats()
// looks). The comm watchdog watches the oldest one not complete: past
// parallel.comm_timeout it ends the job with a message naming it. bytes_sent
// is counted as for MPI; wait_seconds stays 0 (wait() does not block the host).
//
// Groups with the same members (a split that keeps them all, or the mesh's
// dp, dp_cp and ep_dp groups when cp = ep = 1) share one NCCL communicator:
// each holds its own buffers on the GPU, outside the memory plan.
//
// Point-to-point transfers of GPU tensors (pipelines) go through host memory
// and the host group (comm/staged_group.h), which matches them by tag: slow
// (the host waits for the tensor's producers; two copies over the host bus),
// counted in ops and bytes_sent but not in busy_seconds. A ring step
// (send_recv, context parallelism's) is a collective and runs on NCCL: one
// grouped ncclSend / ncclRecv on the communication stream, device to device.
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "core/device.h"

namespace zt::comm {

// Whether this build has the NCCL backend (NCCL found when it was built).
bool nccl_available();

// A group over host's processes whose GPU operations run on `device` (this
// process's GPU). Collective over `host`: every member calls it. Throws
// zt::Error naming the problem when NCCL is missing or fails to initialise.
std::unique_ptr<ProcessGroup> make_nccl_group(std::unique_ptr<ProcessGroup> host, Device device,
                                              const std::string& name);

// The NCCL communicators that `group` (an NCCL group), the group it was
// split from and their other splits hold now (0 for any other group).
int nccl_communicators(const ProcessGroup& group);

}  // namespace zt::comm
