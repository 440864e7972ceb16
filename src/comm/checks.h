// Argument checks shared by the backends: every rank runs the same checks
// on the same shapes, so a bad call fails everywhere with the same message
// before anything is communicated.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "comm/process_group.h"

namespace zt::comm {

// "comm: all_reduce on group 'dp': "
std::string where(const char* op, const ProcessGroup& g);
void check_host(const char* op, const ProcessGroup& g, const Tensor& t);
void check_reducible(const char* op, const ProcessGroup& g, const Tensor& t);
void check_same_dtype(const char* op, const ProcessGroup& g, const Tensor& a, const Tensor& b);
void check_numel(const char* op, const ProcessGroup& g, const char* what, int64_t got, int64_t want);
void check_peer(const char* op, const ProcessGroup& g, int peer, bool self_ok);
// Counts of all_to_allv: size() non-negative entries summing to numel.
void check_counts(const char* op, const ProcessGroup& g, const char* what, std::span<const int64_t> counts,
                  int64_t numel);

// Everything all_to_allv requires of its arguments.
void check_all_to_allv(const ProcessGroup& g, const Tensor& out, std::span<const int64_t> out_counts,
                       const Tensor& in, std::span<const int64_t> in_counts);

}  // namespace zt::comm
