// Which GPU each process of a multi-process job trains on, when the config
// leaves it to the local rank (train.device = "cuda"): a launcher that binds
// one GPU per process (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES set per
// rank) shows each process fewer GPUs than the node has processes, which the
// local-rank rule alone reads as processes sharing GPUs (refused for NCCL).
// The GPUs' UUIDs, gathered over the job, tell the two apart.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "train/config.h"

namespace zt::train {

// Whether every process has a GPU of its own: uuids[r] is the UUID of the
// GPU process r would take by its local rank ("" for none).
bool each_process_has_its_own_gpu(const std::vector<std::string>& uuids);

struct GpuPlacement {
  Config config;     // as given, or with train.device = "cuda:N" named for this process
  std::string note;  // one line for the log when it named the device, else ""
};

// Collective over `world` (every rank calls it, with the same config) when
// several processes leave the GPU to the local rank: gathers each process's
// `uuid` - the UUID of cuda:(local_rank % gpus), "" when it sees no GPU -
// and, when all differ, names each process's GPU (train.device =
// "cuda:N"), so the job trains over NCCL with no GPU counted as shared.
// Otherwise (or for another config) returns the config unchanged and the
// local-rank rule decides (Config::device).
GpuPlacement place_on_gpus(Config cfg, comm::ProcessGroup& world, int local_rank, int gpus, const std::string& uuid);

// place_on_gpus with this process's local rank, visible GPUs and their UUID.
GpuPlacement place_on_gpus(Config cfg, comm::ProcessGroup& world);

}  // namespace zt::train
