// Zettatron's logits against tests/reference/hf_logits.py (an independent
// PyTorch forward pass in Hugging Face conventions) on an exported directory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ckpt/safetensors.h"
#include "nn/transformer.h"
#include "test_util.h"

namespace zt::train {

struct LogitsComparison {
  double max_abs_diff = 0;  // over the real vocabulary (padding columns left out)
  double max_abs_ref = 0;
  double rel() const { return max_abs_ref > 0 ? max_abs_diff / max_abs_ref : max_abs_diff; }
};

// tokens: (B, T) i32. Scratch files go to scratch_prefix + ".tokens" / ".ref".
inline LogitsComparison compare_with_hf_reference(nn::Transformer& model, const Tensor& tokens,
                                                  const std::string& hf_dir, const std::string& scratch_prefix) {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  const int64_t V = model.config().vocab_size, Vp = model.config().padded_vocab();
  ckpt::write_safetensors(scratch_prefix + ".tokens", {{"tokens", tokens}});
  const std::string cmd = "cd " ZT_SOURCE_DIR "/tests/reference && /usr/bin/python3 hf_logits.py " + hf_dir + " " +
                          scratch_prefix + ".tokens " + scratch_prefix + ".ref";
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("the PyTorch reference failed: " + cmd +
                             " (Debian's python3-torch is installed by make deps)");
  const auto ref_file = ckpt::SafetensorsFile::open(scratch_prefix + ".ref");
  const Tensor ref = ref_file.tensor("logits");
  if (ref.shape() != Shape{B, T, V}) throw std::runtime_error("reference logits have shape " + ref.shape().str());
  Tensor logits = Tensor::empty(Shape{B, T, Vp}, DType::f32);
  test::poison(logits);
  model.logits(logits, tokens);
  LogitsComparison c;
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t v = 0; v < V; ++v) {
      const double g = logits.data<float>()[r * Vp + v], want = ref.data<float>()[r * V + v];
      c.max_abs_diff = std::max(c.max_abs_diff, std::isfinite(g) ? std::fabs(g - want) : INFINITY);
      c.max_abs_ref = std::max(c.max_abs_ref, std::fabs(want));
    }
  return c;
}

}  // namespace zt::train
