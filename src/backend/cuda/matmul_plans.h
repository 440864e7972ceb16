// A file of tuned matmul choices (ZT_CUDA_MATMUL_PLANS, backend/cuda/matmul.h):
// what a tuning run chose for each product, so that a deterministic run
// takes the same algorithms every time instead of the heuristic's first.
// Host-only (no CUDA headers): the format is tested on any machine.
//
// One line per product, "<choice>\t<product>": the choice is "lt <n>"
// (cuBLASLt's n-th ranked algorithm for the product, from 0) or "cublas"
// (cuBLAS's own GEMM); the product names the GPU, the cuBLASLt version and
// the product's shape, strides, dtypes, epilogue and alignments, so a line
// made on another GPU or library matches nothing. Lines starting with '#'
// and empty lines are comments. The first line for a product wins: tuning
// runs append, and a later run never changes what an earlier one recorded.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace zt::cuda {

// How many of cuBLASLt's ranked algorithms a plan asks for, tunes over and
// can record (candidates 0 .. kMatmulCandidates - 1).
constexpr int kMatmulCandidates = 16;

struct MatmulChoice {
  bool cublas = false;  // cuBLAS's own GEMM
  int candidate = 0;    // else cuBLASLt's ranked candidate
  bool operator==(const MatmulChoice&) const = default;
};

// "lt <n>" or "cublas".
std::string format_matmul_choice(const MatmulChoice& choice);
// The choice a line's first field names; nothing when it names none or a
// candidate outside 0 .. kMatmulCandidates - 1.
std::optional<MatmulChoice> parse_matmul_choice(std::string_view text);

class MatmulPlanFile {
 public:
  // Reads the choices at `path` (a file that does not exist yet holds none).
  // A line that is not "<choice>\t<product>" throws zt::Error naming the
  // file and line, and the fix.
  explicit MatmulPlanFile(std::string path);

  const std::string& path() const { return path_; }
  // The recorded choice for `product`.
  std::optional<MatmulChoice> find(const std::string& product) const;
  // Appends `choice` for `product` (one write to a file opened for
  // appending, so processes that tune at once do not interleave lines) unless
  // the product already has one, on a line of its own also after a last line
  // left without its newline; throws zt::Error when the file cannot be
  // written.
  void record(const std::string& product, const MatmulChoice& choice);

 private:
  std::string path_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, MatmulChoice> choices_;
};

}  // namespace zt::cuda
