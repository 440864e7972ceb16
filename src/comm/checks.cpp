#include "comm/checks.h"

#include "core/error.h"

namespace zt::comm {

std::string where(const char* op, const ProcessGroup& g) {
  return std::string("comm: ") + op + " on group '" + g.name() + "' (size " + std::to_string(g.size()) + "): ";
}

void check_host(const char* op, const ProcessGroup& g, const Tensor& t) {
  ZT_CHECK(t.defined(), where(op, g), "undefined tensor");
  ZT_CHECK(t.device().is_cpu(), where(op, g), "the tensor is on ", t.device().str(),
           "; this backend moves host tensors (GPU tensors go through NCCL with the CUDA backend)");
}

void check_reducible(const char* op, const ProcessGroup& g, const Tensor& t) {
  const DType d = t.dtype();
  ZT_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::i32 || d == DType::i64, where(op, g),
           "cannot reduce ", dtype_name(d), " (f32, bf16, f16, i32 and i64 can be reduced)");
}

void check_same_dtype(const char* op, const ProcessGroup& g, const Tensor& a, const Tensor& b) {
  ZT_CHECK(a.dtype() == b.dtype(), where(op, g), "output is ", dtype_name(a.dtype()), " but input is ",
           dtype_name(b.dtype()));
}

void check_numel(const char* op, const ProcessGroup& g, const char* what, int64_t got, int64_t want) {
  ZT_CHECK(got == want, where(op, g), what, " has ", got, " elements, expected ", want);
}

void check_peer(const char* op, const ProcessGroup& g, int peer, bool self_ok) {
  ZT_CHECK(peer >= 0 && peer < g.size(), where(op, g), "rank ", peer, " is outside the group");
  ZT_CHECK(self_ok || peer != g.rank(), where(op, g), "rank ", peer, " is this rank (no peer to talk to)");
}

void check_counts(const char* op, const ProcessGroup& g, const char* what, std::span<const int64_t> counts,
                  int64_t numel) {
  ZT_CHECK(int64_t(counts.size()) == g.size(), where(op, g), what, " has ", counts.size(), " entries, expected ",
           g.size());
  int64_t sum = 0;
  for (int64_t c : counts) {
    ZT_CHECK(c >= 0, where(op, g), what, " holds a negative count");
    sum += c;
  }
  ZT_CHECK(sum == numel, where(op, g), what, " sum to ", sum, " elements, the tensor has ", numel);
}

void check_all_to_allv(const ProcessGroup& g, const Tensor& out, std::span<const int64_t> out_counts,
                       const Tensor& in, std::span<const int64_t> in_counts) {
  check_host("all_to_allv", g, out);
  check_host("all_to_allv", g, in);
  check_same_dtype("all_to_allv", g, out, in);
  check_counts("all_to_allv", g, "out_counts", out_counts, out.numel());
  check_counts("all_to_allv", g, "in_counts", in_counts, in.numel());
}

}  // namespace zt::comm
