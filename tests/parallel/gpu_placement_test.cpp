// Which GPU each process takes under mpirun when the config leaves it to the
// local rank: the GPUs' UUIDs (given here, as this machine has none) are
// gathered over the world; when every process has a GPU of its own (a
// launcher that binds one per process), each names its device, else the
// config stays as it was - the same decision on every rank.
#include "train/gpu_placement.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/process_group.h"

namespace zt::train {
namespace {

Config with_device(const std::string& device) {
  return parse_config("[model]\npreset = \"gpt2-tiny\"\n[data]\ndir = \"unused\"\n[train]\nseq_len = 32\ndevice = \"" +
                          device + "\"\n",
                      "placement");
}

TEST(GpuPlacement, EachProcessHasItsOwnGpuOnlyWhenAllUuidsDiffer) {
  EXPECT_TRUE(each_process_has_its_own_gpu({"GPU-a"}));
  EXPECT_TRUE(each_process_has_its_own_gpu({"GPU-a", "GPU-b", "GPU-c"}));
  EXPECT_FALSE(each_process_has_its_own_gpu({"GPU-a", "GPU-b", "GPU-a"})) << "two processes on one GPU";
  EXPECT_FALSE(each_process_has_its_own_gpu({"GPU-a", ""})) << "a process that sees no GPU";
  EXPECT_FALSE(each_process_has_its_own_gpu({}));
}

TEST(GpuPlacement, ALauncherThatBindsOneGpuPerProcessIsSeenByTheUuids) {
  comm::ProcessGroup& world = comm::world();
  const int p = world.size(), r = world.rank();
  // Each process sees one GPU (srun --gpus-per-task=1), each a different one.
  const GpuPlacement own = place_on_gpus(with_device("cuda"), world, r, 1, "GPU-" + std::to_string(r));
  if (p == 1) {
    EXPECT_EQ(own.config.train.device, "cuda") << "one process: the local-rank rule has nothing to tell apart";
    EXPECT_EQ(own.note, "");
  } else {
    EXPECT_EQ(own.config.train.device, "cuda:0");
    EXPECT_FALSE(own.config.gpu_by_local_rank()) << "placed: no GPU counted as shared";
    EXPECT_NE(own.note.find("each of the " + std::to_string(p) + " processes has a GPU of its own"),
              std::string::npos)
        << own.note;
  }
  // Every process sees the node's 8 GPUs: the local rank's, named.
  const GpuPlacement all = place_on_gpus(with_device("cuda"), world, r, 8, "GPU-" + std::to_string(r % 8));
  EXPECT_EQ(all.config.train.device, p == 1 ? "cuda" : "cuda:" + std::to_string(r % 8));
  // Processes sharing one GPU (the same UUID everywhere): the config as it
  // was, for the local-rank rule (shared through MPI, or refused for NCCL).
  const GpuPlacement shared = place_on_gpus(with_device("cuda"), world, r, 1, "GPU-same");
  EXPECT_EQ(shared.config.train.device, "cuda");
  EXPECT_EQ(shared.note, "");
  // One process without a GPU: unchanged on every rank, not only on it.
  const GpuPlacement missing =
      place_on_gpus(with_device("cuda"), world, r, r == p - 1 ? 0 : 1, "GPU-" + std::to_string(r));
  EXPECT_EQ(missing.config.train.device, "cuda");
  // A device the user named, or the CPU: no gather, unchanged.
  EXPECT_EQ(place_on_gpus(with_device("cuda:1"), world, r, 1, "GPU-x").config.train.device, "cuda:1");
  EXPECT_EQ(place_on_gpus(with_device("cpu"), world, r, 0, "").config.train.device, "cpu");
}

}  // namespace
}  // namespace zt::train
