// A group of one process: no communication; every operation completes at
// once with the semantics of the collective on one rank.
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"

namespace zt::comm {

class SoloGroup : public ProcessGroup {
 public:
  explicit SoloGroup(std::string name, int world_rank = 0);
  WorkHandle all_reduce(const Tensor& t, ReduceOp op) override;
  WorkHandle reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override;
  WorkHandle all_gather(const Tensor& out, const Tensor& in) override;
  WorkHandle broadcast(const Tensor& t, int root) override;
  WorkHandle send(const Tensor& t, int dst, int tag) override;
  WorkHandle recv(const Tensor& t, int src, int tag) override;
  WorkHandle all_to_all(const Tensor& out, const Tensor& in) override;
  WorkHandle all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                         std::span<const int64_t> in_counts) override;
  WorkHandle barrier() override;
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;
};

}  // namespace zt::comm
