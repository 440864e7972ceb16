#include "train/gpu_placement.h"

#include <set>

#include "ops/device.h"

namespace zt::train {

bool each_process_has_its_own_gpu(const std::vector<std::string>& uuids) {
  std::set<std::string> seen;
  for (const std::string& u : uuids)
    if (u.empty() || !seen.insert(u).second) return false;
  return !uuids.empty();
}

GpuPlacement place_on_gpus(Config cfg, comm::ProcessGroup& world, int local_rank, int gpus, const std::string& uuid) {
  // The config decides whether to gather: the same on every rank.
  if (world.size() <= 1 || !cfg.gpu_by_local_rank()) return {std::move(cfg), ""};
  const std::vector<std::string> uuids = comm::all_gather_strings(world, gpus > 0 ? uuid : std::string());
  if (!each_process_has_its_own_gpu(uuids)) return {std::move(cfg), ""};
  const int index = local_rank % gpus;
  cfg.train.device = "cuda:" + std::to_string(index);
  std::string note = "devices: each of the " + std::to_string(world.size()) +
                     " processes has a GPU of its own (their UUIDs differ); this one trains on cuda:" +
                     std::to_string(index);
  return {std::move(cfg), std::move(note)};
}

GpuPlacement place_on_gpus(Config cfg, comm::ProcessGroup& world) {
  if (world.size() <= 1 || !cfg.gpu_by_local_rank()) return {std::move(cfg), ""};  // no GPU asked about
  const int gpus = ops::gpu_count();
  const comm::WorldInfo w = comm::world_info();
  const std::string uuid = gpus > 0 ? ops::gpu_uuid(w.local_rank % gpus) : "";
  return place_on_gpus(std::move(cfg), world, w.local_rank, gpus, uuid);
}

}  // namespace zt::train
