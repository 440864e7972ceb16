// The mesh: shape resolution and validation (pure, the same verdict on every
// rank), rank <-> coordinate mapping, and the groups built from the world.
#include <gtest/gtest.h>

#include <set>

#include "comm/process_group.h"
#include "core/error.h"
#include "parallel/mesh.h"

namespace zt::parallel {
namespace {

TEST(MeshShape, ResolvesDpFromTheWorldAndNamesBadLayouts) {
  EXPECT_EQ(resolve_mesh_shape({0, 2, 2, 1, 1}, 8).dp, 2);
  EXPECT_EQ(resolve_mesh_shape({0, 1, 1, 1, 1}, 3).dp, 3);
  try {
    resolve_mesh_shape({2, 2, 1, 1, 1}, 8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs dp x tp x pp x cp = 4 processes, but the job has 8"),
              std::string::npos)
        << e.what();
  }
  try {
    resolve_mesh_shape({0, 3, 1, 1, 1}, 8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp x pp x cp = 3 does not divide 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_mesh_shape({2, 1, 1, 2, 3}, 4), Error);  // ep 3 does not divide dp x cp = 4
  EXPECT_THROW(resolve_mesh_shape({1, 0, 1, 1, 1}, 1), Error);
}

TEST(MeshShape, RanksAndCoordinatesAreABijectionWithTpInnermost) {
  const MeshShape s = resolve_mesh_shape({2, 2, 3, 2, 1}, 24);
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 24; ++r) {
    const MeshCoord c = coord_of(s, r);
    EXPECT_EQ(rank_of(s, c), r);
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_EQ(coord_of(s, 1).tp, 1);   // tp innermost
  EXPECT_EQ(coord_of(s, 2).cp, 1);   // then cp
  EXPECT_EQ(coord_of(s, 4).dp, 1);   // then dp
  EXPECT_EQ(coord_of(s, 8).pp, 1);   // pp outermost
}

// Under mpirun: with the world as dp x tp (tp = 2 when the world is even),
// every group holds exactly the ranks that share the other coordinates.
TEST(Mesh, GroupsMatchTheCoordinates) {
  comm::ProcessGroup& world = comm::world();
  const int64_t W = world.size();
  const int64_t tp = W % 2 == 0 ? 2 : 1;
  Mesh mesh({0, tp, 1, 1, 1}, world);
  const MeshShape& s = mesh.shape();
  EXPECT_EQ(s.dp * s.tp, W);
  EXPECT_EQ(mesh.tp().size(), tp);
  EXPECT_EQ(mesh.dp().size(), W / tp);
  EXPECT_EQ(mesh.tp().rank(), mesh.coord().tp);
  EXPECT_EQ(mesh.dp().rank(), mesh.coord().dp);
  for (size_t i = 0; i < mesh.dp().world_ranks().size(); ++i) {
    const MeshCoord c = coord_of(s, mesh.dp().world_ranks()[i]);
    EXPECT_EQ(c.tp, mesh.coord().tp);
    EXPECT_EQ(c.dp, int64_t(i));
  }
  for (size_t i = 0; i < mesh.tp().world_ranks().size(); ++i) {
    const MeshCoord c = coord_of(s, mesh.tp().world_ranks()[i]);
    EXPECT_EQ(c.dp, mesh.coord().dp);
    EXPECT_EQ(c.tp, int64_t(i));
  }
  EXPECT_EQ(mesh.pp().size(), 1);
  EXPECT_EQ(mesh.pp_prev(), -1);
  EXPECT_EQ(mesh.pp_next(), -1);
  EXPECT_EQ(mesh.dp_cp().size(), W / tp);
  // A sum over the dp group counts its members.
  Tensor one = Tensor::empty(Shape{1}, DType::i64);
  one.data<int64_t>()[0] = 1;
  mesh.dp().all_reduce(one)->wait();
  EXPECT_EQ(one.data<int64_t>()[0], W / tp);
}

}  // namespace
}  // namespace zt::parallel
