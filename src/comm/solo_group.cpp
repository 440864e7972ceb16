#include "comm/solo_group.h"

#include <cstring>

#include "comm/checks.h"
#include "comm/work_queue.h"
#include "core/error.h"

namespace zt::comm {

namespace {
WorkHandle done() { return std::make_shared<DoneWork>(); }
void copy_bytes(const Tensor& out, const Tensor& in) {
  if (out.nbytes() && out.data_ptr() != in.data_ptr()) std::memmove(out.data_ptr(), in.data_ptr(), in.nbytes());
}
}  // namespace

SoloGroup::SoloGroup(std::string name, int world_rank) {
  name_ = std::move(name);
  rank_ = 0;
  size_ = 1;
  world_ranks_ = {world_rank};
}

WorkHandle SoloGroup::all_reduce(const Tensor& t, ReduceOp) {
  check_host("all_reduce", *this, t);
  check_reducible("all_reduce", *this, t);
  count_op(0);
  return done();
}

WorkHandle SoloGroup::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp) {
  check_host("reduce_scatter", *this, out);
  check_host("reduce_scatter", *this, in);
  check_reducible("reduce_scatter", *this, in);
  check_same_dtype("reduce_scatter", *this, out, in);
  check_numel("reduce_scatter", *this, "the input", in.numel(), out.numel());
  copy_bytes(out, in);
  count_op(0);
  return done();
}

WorkHandle SoloGroup::all_gather(const Tensor& out, const Tensor& in) {
  check_host("all_gather", *this, out);
  check_host("all_gather", *this, in);
  check_same_dtype("all_gather", *this, out, in);
  check_numel("all_gather", *this, "the output", out.numel(), in.numel());
  copy_bytes(out, in);
  count_op(0);
  return done();
}

WorkHandle SoloGroup::broadcast(const Tensor& t, int root) {
  check_host("broadcast", *this, t);
  check_peer("broadcast", *this, root, true);
  count_op(0);
  return done();
}

WorkHandle SoloGroup::send(const Tensor& t, int dst, int) {
  check_host("send", *this, t);
  check_peer("send", *this, dst, false);
  return done();
}

WorkHandle SoloGroup::recv(const Tensor& t, int src, int) {
  check_host("recv", *this, t);
  check_peer("recv", *this, src, false);
  return done();
}

WorkHandle SoloGroup::all_to_all(const Tensor& out, const Tensor& in) {
  check_host("all_to_all", *this, out);
  check_host("all_to_all", *this, in);
  check_same_dtype("all_to_all", *this, out, in);
  check_numel("all_to_all", *this, "the output", out.numel(), in.numel());
  copy_bytes(out, in);
  count_op(0);
  return done();
}

WorkHandle SoloGroup::all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                                  std::span<const int64_t> in_counts) {
  check_all_to_allv(*this, out, out_counts, in, in_counts);
  ZT_CHECK(out_counts[0] == in_counts[0], where("all_to_allv", *this), "this rank sends itself ", in_counts[0],
           " elements but expects ", out_counts[0]);
  copy_bytes(out, in);
  count_op(0);
  return done();
}

WorkHandle SoloGroup::barrier() { return done(); }

std::unique_ptr<ProcessGroup> SoloGroup::split(int, int, const std::string& name) {
  return std::make_unique<SoloGroup>(name, world_ranks_[0]);
}

}  // namespace zt::comm
