// Shared by the mpirun tests of parallel/: the fortunes corpus, prepared
// once per job by rank 0 into a directory every rank knows.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "nn/model_config.h"
#include "test_util.h"
#include "train/config.h"

namespace zt::test {

inline const std::filesystem::path& fortunes_dataset() {
  static const std::filesystem::path dir = [] {
    comm::ProcessGroup& w = comm::world();
    Tensor id = Tensor::empty(Shape{1}, DType::i64);
    id.data<int64_t>()[0] = w.rank() == 0 ? int64_t(::getpid()) : 0;
    w.all_reduce(id)->wait();  // rank 0's pid names the directory
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("zt_parallel_data_" + std::to_string(id.data<int64_t>()[0]));
    if (w.rank() == 0) {
      const std::string cmd = std::string(ZT_BINARY_DIR) +
                              "/bin/zettatron prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes "
                              "--doc-split percent --val-fraction 0.05 --output " + d.string() + " > /dev/null";
      if (std::system(cmd.c_str()) != 0) std::abort();
    }
    w.barrier()->wait();
    return d;
  }();
  return dir;
}

// The tiny training config the parallel tests share: `preset` with GPT-2's
// vocabulary on the fortunes corpus, T = 32, a global batch of 8 sequences in
// micro-batches of 2, 10 steps, AdamW at lr 3e-3 after 2 warm-up steps, no
// samples. `more` overrides it ("section.key=value", applied in order).
inline train::Config fortunes_config(const std::string& preset, const std::vector<std::string>& more = {}) {
  const std::string text = "[model]\npreset = \"" + preset + "\"\nvocab_size = 50257\n[data]\ndir = \"" +
                           fortunes_dataset().string() + "\"\ntokenizer = \"\"\n[train]\nseq_len = 32\n"
                           "global_batch = 8\nmicro_batch = 2\nsteps = 10\nlog_every = 100\n[optim]\nlr = 3e-3\n"
                           "warmup_steps = 2\n[sample]\ncount = 0\n[metrics]\npeak_gflops = 1\n";
  return train::parse_config(text, preset + " on fortunes", more);
}

// The result of run() for the single-process reference named `key` (which
// must determine the reference's config), computed once per process: several
// layouts compare against the same reference, and under mpirun every rank
// runs each reference whole, the largest share of these tests' time.
template <typename Result>
const Result& cached_reference(const std::string& key, const std::function<Result()>& run) {
  static std::map<std::string, Result> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run()).first;
  return it->second;
}

// ||got - ref|| / ||ref|| of a weight after training, leaving out the key
// rows of a qkv bias: the key bias gets no gradient in exact arithmetic
// (adding one vector to every key shifts each query's scores by a
// constant, which softmax ignores), only rounding noise, which AdamW's
// g / sqrt(v) turns into lr-sized steps of arbitrary sign in any
// implementation - two correct runs that sum in another order disagree there.
inline double weight_rel_diff(const std::string& name, const Tensor& got, const Tensor& ref, const nn::ModelConfig& c) {
  const int64_t q = c.n_head * c.head_dim(), kv = c.n_kv_head * c.head_dim();
  const bool key_bias = name.size() >= 13 && name.compare(name.size() - 13, 13, "attn.qkv.bias") == 0;
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    if (key_bias && i >= q && i < q + kv) continue;
    const double x = load_f64(got, i), y = load_f64(ref, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// weight_rel_diff over whole layers ("embed", "layers.N", "head"): one
// element whose gradient is almost zero (a GeLU unit that rarely fires) can
// move by a few ulps of its update when a sum's order changes - AdamW divides
// by sqrt(v) - which a small tensor's norm shows and a layer's does not.
inline std::map<std::string, double> layer_rel_diffs(const std::map<std::string, Tensor>& got,
                                                     const std::map<std::string, Tensor>& ref, const nn::ModelConfig& c) {
  std::map<std::string, std::pair<double, double>> acc;  // layer -> (|got - ref|^2, |ref|^2)
  const int64_t q = c.n_head * c.head_dim(), kv = c.n_kv_head * c.head_dim();
  for (const auto& [name, g] : got) {
    const Tensor& r = ref.at(name);
    const std::string layer = name.rfind("layers.", 0) == 0 ? name.substr(0, name.find('.', 7))
                              : name.rfind("embed.", 0) == 0 ? "embed" : "head";
    const bool key_bias = name.size() >= 13 && name.compare(name.size() - 13, 13, "attn.qkv.bias") == 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      if (key_bias && i >= q && i < q + kv) continue;  // see weight_rel_diff
      const double x = load_f64(g, i), y = load_f64(r, i);
      acc[layer].first += (x - y) * (x - y);
      acc[layer].second += y * y;
    }
  }
  std::map<std::string, double> out;
  for (const auto& [layer, v] : acc) out[layer] = v.second > 0 ? std::sqrt(v.first / v.second) : std::sqrt(v.first);
  return out;
}

}  // namespace zt::test
