// libFuzzer target for the safetensors parser (built by scripts/fuzz_safetensors.sh
// with clang, ASan and UBSan). Any input must either parse or raise
// zt::Error; anything else - a crash, a sanitizer report, another exception
// escaping, or a broken invariant below - is a finding.
//
// Invariants checked on every accepted input:
//   - every tensor's bytes lie inside the input (they are all read, so ASan
//     would report an overread) and match its TensorInfo;
//   - rewriting the file with its own layout() gives a canonical file that
//     parses to the same names, metadata and bytes;
//   - if the input is canonical(), that rewrite is byte-identical to it.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/error.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool same_bytes(const zt::Tensor& a, const zt::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using zt::ckpt::SafetensorsFile;
  try {
    const SafetensorsFile f = SafetensorsFile::parse(std::span<const uint8_t>(data, size), "fuzz.safetensors");
    const auto tensors = f.tensors();
    check(tensors.size() == f.size());
    unsigned sum = 0;
    for (const auto& [name, t] : tensors) {
      const zt::ckpt::TensorInfo& info = f.info(name);
      check(t.dtype() == info.dtype && t.shape() == info.shape && t.nbytes() == info.nbytes());
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    }
    volatile unsigned sink = sum;
    (void)sink;

    const std::vector<uint8_t> again = zt::ckpt::safetensors_bytes(tensors, f.metadata(), f.layout());
    if (f.canonical()) check(again.size() == size && std::memcmp(again.data(), data, size) == 0);
    const SafetensorsFile g = SafetensorsFile::parse(again, "rewrite.safetensors");
    check(g.canonical());
    check(g.names() == f.names() && g.header_names() == f.header_names() && g.metadata() == f.metadata());
    for (const auto& [name, t] : tensors) check(same_bytes(g.tensor(name), t));
  } catch (const zt::Error&) {
    // rejected with a message: fine
  }
  return 0;
}
