#include "parallel/mesh.h"

#include "core/error.h"

namespace zt::parallel {

std::string MeshShape::str() const {
  return "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
         " cp=" + std::to_string(cp) + " ep=" + std::to_string(ep);
}

MeshShape resolve_mesh_shape(MeshShape s, int64_t world_size) {
  ZT_CHECK(s.tp >= 1 && s.pp >= 1 && s.cp >= 1 && s.ep >= 1 && s.dp >= 0, "parallel sizes must be >= 1 (dp may be 0: "
           "the rest of the world), got ", s.str());
  const int64_t others = s.tp * s.pp * s.cp;
  if (s.dp == 0) {
    ZT_CHECK(world_size % others == 0, "parallel.dp = 0 takes the rest of the ", world_size,
             " processes, but tp x pp x cp = ", others, " does not divide ", world_size,
             "; launch a multiple of ", others, " processes or change the sizes");
    s.dp = world_size / others;
  }
  ZT_CHECK(s.world() == world_size, "the parallel layout ", s.str(), " needs dp x tp x pp x cp = ", s.world(),
           " processes, but the job has ", world_size, "; launch ", s.world(), " (mpirun -np ", s.world(),
           ") or set parallel.dp = 0 to use every process for data parallelism");
  ZT_CHECK((s.dp * s.cp) % s.ep == 0, "parallel.ep = ", s.ep, " must divide dp x cp = ", s.dp * s.cp,
           " (experts are sharded within the data-parallel group)");
  return s;
}

MeshCoord coord_of(const MeshShape& s, int64_t r) {
  MeshCoord c;
  c.tp = r % s.tp;
  r /= s.tp;
  c.cp = r % s.cp;
  r /= s.cp;
  c.dp = r % s.dp;
  c.pp = r / s.dp;
  return c;
}

int64_t rank_of(const MeshShape& s, const MeshCoord& c) { return c.tp + s.tp * (c.cp + s.cp * (c.dp + s.dp * c.pp)); }

Mesh::Mesh(const MeshShape& shape, comm::ProcessGroup& world)
    : shape_(resolve_mesh_shape(shape, world.size())), world_rank_(world.rank()) {
  coord_ = coord_of(shape_, world_rank_);
  const MeshCoord c = coord_;
  const MeshShape& s = shape_;
  // Each group: the ranks that share every other coordinate (the color, a
  // distinct number per group), ordered by their coordinate in the group's
  // dimension (the key).
  tp_ = world.split(int(rank_of(s, {c.dp, 0, c.pp, c.cp})), int(c.tp), "tp");
  cp_ = world.split(int(rank_of(s, {c.dp, c.tp, c.pp, 0})), int(c.cp), "cp");
  dp_ = world.split(int(rank_of(s, {0, c.tp, c.pp, c.cp})), int(c.dp), "dp");
  pp_ = world.split(int(rank_of(s, {c.dp, c.tp, 0, c.cp})), int(c.pp), "pp");
  // dp x cp: same tp and pp; ordered by (dp, cp).
  const int64_t dpcp_index = c.cp + s.cp * c.dp;
  dp_cp_ = world.split(int(c.tp + s.tp * c.pp), int(dpcp_index), "dp_cp");
  // ep: ep consecutive members of dp x cp; ep_dp: same position inside its ep group.
  const int64_t outer = c.tp + s.tp * c.pp, ep_groups = s.dp * s.cp / s.ep;
  ep_ = world.split(int(outer * ep_groups + dpcp_index / s.ep), int(dpcp_index % s.ep), "ep");
  ep_dp_ = world.split(int(outer * s.ep + dpcp_index % s.ep), int(dpcp_index / s.ep), "ep_dp");
}

int64_t Mesh::pp_prev() const {
  if (coord_.pp == 0) return -1;
  MeshCoord c = coord_;
  --c.pp;
  return rank_of(shape_, c);
}

int64_t Mesh::pp_next() const {
  if (coord_.pp + 1 == shape_.pp) return -1;
  MeshCoord c = coord_;
  ++c.pp;
  return rank_of(shape_, c);
}

}  // namespace zt::parallel
