// The device mesh: world ranks arranged on five parallel dimensions.
//
//   world rank = tp + TP * (cp + CP * (dp + DP * pp))
//
// tp is innermost (its ranks are neighbours, on one node: tensor-parallel
// traffic is the heaviest), then cp, then dp, and pp outermost. Expert
// parallelism splits the dp x cp group into groups of ep consecutive ranks
// (experts sharded among them); the ranks holding the same experts form the
// expert-data-parallel group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/process_group.h"

namespace zt::parallel {

struct MeshShape {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int64_t world() const { return dp * tp * pp * cp; }
  std::string str() const;  // "dp=2 tp=1 pp=1 cp=1 ep=1"
};

// Fills dp = 0 ("the rest") from the world size, then checks the shape
// against it: every size >= 1, dp*tp*pp*cp == world_size, ep divides
// dp*cp. Pure (no communication), so every rank reaches the same verdict
// before the first collective; throws zt::Error naming the sizes and the fix.
MeshShape resolve_mesh_shape(MeshShape shape, int64_t world_size);

struct MeshCoord {
  int64_t dp = 0, tp = 0, pp = 0, cp = 0;
};
MeshCoord coord_of(const MeshShape& s, int64_t world_rank);
int64_t rank_of(const MeshShape& s, const MeshCoord& c);

class Mesh {
 public:
  // Collective over `world` (every rank builds its groups by splitting it).
  Mesh(const MeshShape& shape, comm::ProcessGroup& world);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int64_t world_rank() const { return world_rank_; }

  comm::ProcessGroup& dp() const { return *dp_; }
  comm::ProcessGroup& tp() const { return *tp_; }
  comm::ProcessGroup& pp() const { return *pp_; }
  comm::ProcessGroup& cp() const { return *cp_; }
  comm::ProcessGroup& dp_cp() const { return *dp_cp_; }    // gradient reduction with context parallelism
  comm::ProcessGroup& ep() const { return *ep_; }          // expert parallel (within dp x cp)
  comm::ProcessGroup& ep_dp() const { return *ep_dp_; }    // replicas of the same experts

  // Pipeline neighbours (world ranks), -1 at the ends.
  int64_t pp_prev() const;
  int64_t pp_next() const;

 private:
  MeshShape shape_;
  MeshCoord coord_;
  int64_t world_rank_ = 0;
  std::unique_ptr<comm::ProcessGroup> dp_, tp_, pp_, cp_, dp_cp_, ep_, ep_dp_;
};

}  // namespace zt::parallel
