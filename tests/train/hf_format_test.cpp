// Hugging Face import/export (train/hf_format.h):
//   - exported GPT-2 / Llama 3 models give the logits of an independent
//     PyTorch forward pass in HF conventions (tests/reference/hf_logits.py),
//     so names, transposes, the RoPE row permutation and the head are right;
//   - import(export(model)) is bitwise the model;
//   - HF files written here the way Python writes them (bf16, sharded or not,
//     GPT-2 buffers, several metadata keys) come back byte for byte from
//     import + export with the recorded layout;
//   - bad directories and configs raise zt::Error naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "nn/transformer.h"
#include "test_util.h"
#include "train/hf_reference.h"
#include "train/hf_format.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

#define EXPECT_CONTAINS(text, sub) \
  EXPECT_NE(std::string(text).find(sub), std::string::npos) << "message: " << (text) << "\nlacks: " << (sub)

// A fresh, empty directory for one test (removed first if a previous run left it).
fs::path temp_dir(const std::string& name) {
  static int counter = 0;
  const fs::path d = fs::temp_directory_path() /
                     ("zt_hf_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::set<std::string> file_names(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

// Every parameter random (norm weights near 1, biases and weights around 0),
// vocabulary padding rows zero as the model keeps them.
void randomize(nn::Transformer& model, std::mt19937_64& rng) {
  const nn::ModelConfig& c = model.config();
  model.init_weights(rng());
  for (const nn::ParamSet* s : model.param_sets())
    for (size_t i = 0; i < s->size(); ++i) {
      const std::string& name = s->spec(i).name;
      const Tensor p = s->param(i);
      const bool norm = name.find("norm.weight") != std::string::npos;
      const double lo = norm ? 0.7 : -0.15, hi = norm ? 1.3 : 0.15;
      std::uniform_real_distribution<double> d(lo, hi);
      const bool vocab = name == "embed.wte" || name == "lm_head.weight";
      const int64_t live = vocab ? c.vocab_size * c.d_model : p.numel();
      for (int64_t j = 0; j < p.numel(); ++j) test::store_f64(p, j, j < live ? d(rng) : 0.0);
    }
}

std::vector<std::pair<std::string, Tensor>> model_tensors(const nn::Transformer& model) {
  std::vector<std::pair<std::string, Tensor>> v;
  for (const nn::ParamSet* s : model.param_sets())
    for (size_t i = 0; i < s->size(); ++i) v.emplace_back(s->spec(i).name, s->param(i));
  return v;
}

void expect_same_network(const nn::ModelConfig& a, const nn::ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.n_expert, b.n_expert);
  if (a.moe()) {
    EXPECT_EQ(a.expert_top_k, b.expert_top_k);
    EXPECT_EQ(a.expert_normalize, b.expert_normalize);
    EXPECT_EQ(a.router_aux_loss, b.router_aux_loss);
  }
  if (a.arch == nn::Arch::llama3) {
    EXPECT_EQ(a.rope_theta, b.rope_theta);
    EXPECT_EQ(a.rope_scaling.enabled, b.rope_scaling.enabled);
    if (a.rope_scaling.enabled) {
      EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
      EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
      EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
      EXPECT_EQ(a.rope_scaling.original_max_position, b.rope_scaling.original_max_position);
    }
  }
}

// --- exported models against the PyTorch reference -------------------------------------

struct ExportCase {
  std::string name;
  nn::ModelConfig cfg;
  HfExportOptions opt;
};
void PrintTo(const ExportCase& c, std::ostream* os) { *os << c.name; }

nn::ModelConfig variant(const char* preset, void (*edit)(nn::ModelConfig&)) {
  nn::ModelConfig c = nn::model_preset(preset);
  edit(c);
  return c;
}

std::vector<ExportCase> export_cases() {
  return {
      {"gpt2_tiny", nn::model_preset("gpt2-tiny"), {}},
      // llama3-tiny: GQA (4 query, 2 kv heads), untied head, Llama 3 scaling on.
      {"llama3_tiny", nn::model_preset("llama3-tiny"), {}},
      // GQA 8:2, untied, scaling with other factors, vocabulary padded (500 -> 512), sharded.
      {"llama_gqa_untied_scaled",
       variant("llama3-tiny",
               [](nn::ModelConfig& c) {
                 c.vocab_size = 500;
                 c.n_head = 8;
                 c.n_kv_head = 2;
                 c.d_ff = 96;
                 c.rope_scaling = {true, 4.0f, 1.0f, 8.0f, 32};
               }),
       {DType::f32, 40'000}},
      // Tied head, no scaling, one kv head.
      {"llama_tied_unscaled", variant("llama3-tiny",
                                      [](nn::ModelConfig& c) {
                                        c.vocab_size = 300;
                                        c.n_kv_head = 1;
                                        c.tied_embeddings = true;
                                        c.rope_scaling.enabled = false;
                                      }),
       {}},
      // Mixtral: 4 experts, top 2, untied, no RoPE scaling (Mixtral has none), sharded.
      {"mixtral_tiny", nn::model_preset("llama3-moe-tiny"), {DType::f32, 60'000}},
      // GPT-2 with an untied head, n_inner != 4 C, padded vocabulary, sharded.
      {"gpt2_untied_sharded", variant("gpt2-tiny",
                                      [](nn::ModelConfig& c) {
                                        c.vocab_size = 300;
                                        c.d_ff = 96;
                                        c.tied_embeddings = false;
                                        c.norm_eps = 1e-6f;
                                      }),
       {DType::f32, 30'000}},
  };
}

class HfFormatExport : public ::testing::TestWithParam<ExportCase> {};

TEST_P(HfFormatExport, LogitsMatchHfReferenceAndImportIsExact) {
  ZT_TEST_TRACE_SEED();
  const ExportCase& ec = GetParam();
  auto rng = test::make_rng(std::hash<std::string>{}(ec.name));
  nn::Transformer model(ec.cfg, DType::f32);
  randomize(model, rng);
  const fs::path dir = temp_dir(ec.name);
  const fs::path hf = dir / "hf";
  write_hf_model(hf.string(), ec.cfg, model_tensors(model), nullptr, ec.opt);

  // The files: one or several shards (with an index), and a config HF reads.
  const std::set<std::string> files = file_names(hf);
  if (ec.opt.max_shard_bytes > 0) {
    ASSERT_TRUE(files.count("model.safetensors.index.json")) << ec.name << ": expected a sharded export";
    EXPECT_GE(files.size(), 4u) << "config, index and at least two shards";
    EXPECT_FALSE(files.count("model.safetensors"));
  } else {
    EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors"}));
  }
  const json config = json::parse(read_bytes(hf / "config.json"));
  EXPECT_EQ(config["model_type"], ec.cfg.arch == nn::Arch::gpt2 ? "gpt2" : ec.cfg.moe() ? "mixtral" : "llama");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["vocab_size"], ec.cfg.vocab_size);

  // Logits: Zettatron (first vocab_size of padded_vocab columns) vs the reference.
  const int64_t B = 2, T = 24, V = ec.cfg.vocab_size;
  const Tensor tokens = test::random_tokens(Shape{B, T}, V, rng);
  const LogitsComparison cmp = compare_with_hf_reference(model, tokens, hf.string(), (dir / "logits").string());
  const double num = cmp.max_abs_diff, den = cmp.max_abs_ref;
  EXPECT_GT(den, 0.1) << "degenerate reference logits";
  RecordProperty("max_rel_error", std::to_string(num / den));
  EXPECT_LT(num / den, 1e-4) << ec.name << ": max |zettatron - reference| = " << num << ", max |reference| = " << den;

  // import(export(model)) is the model, bit for bit (padding rows included).
  const HfModel back = read_hf_model(hf.string());
  expect_same_network(back.config, ec.cfg);
  const auto orig = model_tensors(model);
  ASSERT_EQ(back.tensors.size(), orig.size());
  for (size_t i = 0; i < orig.size(); ++i) {
    SCOPED_TRACE(orig[i].first);
    EXPECT_EQ(back.tensors[i].first, orig[i].first);
    ASSERT_EQ(back.tensors[i].second.shape(), orig[i].second.shape());
    EXPECT_EQ(back.tensors[i].second.dtype(), DType::f32);
    EXPECT_EQ(std::memcmp(back.tensors[i].second.data_ptr(), orig[i].second.data_ptr(), orig[i].second.nbytes()), 0);
  }

  // The recorded layout writes the export back unchanged.
  EXPECT_TRUE(back.layout.at("byte_identical").get<bool>());
  const fs::path again = dir / "again";
  write_hf_model(again.string(), back.config, back.tensors, back.layout);
  EXPECT_EQ(file_names(again), files);
  for (const std::string& f : files) EXPECT_TRUE(read_bytes(hf / f) == read_bytes(again / f)) << f << " differs";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(HfFormat, HfFormatExport, ::testing::ValuesIn(export_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(HfFormat, Bf16ExportImportsAsTheRoundedWeights) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(11);
  const nn::ModelConfig cfg = nn::model_preset("llama3-tiny");
  nn::Transformer model(cfg, DType::f32);
  randomize(model, rng);
  const fs::path dir = temp_dir("bf16");
  write_hf_model((dir / "hf").string(), cfg, model_tensors(model), nullptr, {DType::bf16, 0});
  const auto f = ckpt::SafetensorsFile::open((dir / "hf" / "model.safetensors").string());
  EXPECT_EQ(f.info("model.norm.weight").dtype, DType::bf16);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(json::parse(read_bytes(dir / "hf" / "config.json"))["torch_dtype"], "bfloat16");
  const HfModel back = read_hf_model((dir / "hf").string());
  for (const auto& [name, t] : back.tensors) {
    const Tensor orig = model.param(name);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float want = bf16_to_float(float_to_bf16(orig.data<float>()[i]));
      ASSERT_EQ(t.data<float>()[i], want) << name << " element " << i;
    }
  }
  fs::remove_all(dir);
}

// --- HF files written the way Python writes them come back byte for byte ----------

struct HfDirCase {
  std::string name;
  nn::ModelConfig cfg;
  bool sharded;
  bool prefix;      // GPT-2: "transformer." names
  bool buffers;     // GPT-2: h.i.attn.bias / masked_bias in the files
  bool lm_head_copy;  // tied head stored anyway
};
void PrintTo(const HfDirCase& c, std::ostream* os) { *os << c.name; }

// HF names and shapes, written out independently of hf_format.cpp.
std::vector<std::pair<std::string, Shape>> hf_tensor_list(const HfDirCase& hc) {
  const nn::ModelConfig& c = hc.cfg;
  const int64_t C = c.d_model, V = c.vocab_size, F = c.d_ff, D = c.head_dim();
  std::vector<std::pair<std::string, Shape>> v;
  if (c.arch == nn::Arch::gpt2) {
    const std::string p = hc.prefix ? "transformer." : "";
    v = {{p + "wte.weight", {V, C}}, {p + "wpe.weight", {c.max_seq_len, C}}, {p + "ln_f.weight", {C}},
         {p + "ln_f.bias", {C}}};
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string h = p + "h." + std::to_string(i) + ".";
      for (const char* ln : {"ln_1", "ln_2"}) {
        v.push_back({h + ln + ".weight", {C}});
        v.push_back({h + ln + ".bias", {C}});
      }
      v.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
      v.push_back({h + "attn.c_attn.bias", {3 * C}});
      v.push_back({h + "attn.c_proj.weight", {C, C}});
      v.push_back({h + "attn.c_proj.bias", {C}});
      v.push_back({h + "mlp.c_fc.weight", {C, F}});
      v.push_back({h + "mlp.c_fc.bias", {F}});
      v.push_back({h + "mlp.c_proj.weight", {F, C}});
      v.push_back({h + "mlp.c_proj.bias", {C}});
    }
  } else {
    v = {{"model.embed_tokens.weight", {V, C}}, {"model.norm.weight", {C}}};
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string m = "model.layers." + std::to_string(i) + ".";
      v.push_back({m + "self_attn.q_proj.weight", {c.n_head * D, C}});
      v.push_back({m + "self_attn.k_proj.weight", {c.n_kv_head * D, C}});
      v.push_back({m + "self_attn.v_proj.weight", {c.n_kv_head * D, C}});
      v.push_back({m + "self_attn.o_proj.weight", {C, c.n_head * D}});
      if (c.moe()) {
        v.push_back({m + "block_sparse_moe.gate.weight", {c.n_expert, C}});
        for (int64_t e = 0; e < c.n_expert; ++e) {
          const std::string w = m + "block_sparse_moe.experts." + std::to_string(e) + ".";
          v.push_back({w + "w1.weight", {F, C}});
          v.push_back({w + "w2.weight", {C, F}});
          v.push_back({w + "w3.weight", {F, C}});
        }
      } else {
        v.push_back({m + "mlp.gate_proj.weight", {F, C}});
        v.push_back({m + "mlp.up_proj.weight", {F, C}});
        v.push_back({m + "mlp.down_proj.weight", {C, F}});
      }
      v.push_back({m + "input_layernorm.weight", {C}});
      v.push_back({m + "post_attention_layernorm.weight", {C}});
    }
  }
  if (!c.tied_embeddings) v.push_back({"lm_head.weight", {V, C}});
  return v;
}

// A config.json as transformers writes it, with keys Zettatron ignores.
std::string python_config_text(const HfDirCase& hc) {
  const nn::ModelConfig& c = hc.cfg;
  json j = hf_config(c, DType::bf16);
  j["transformers_version"] = "4.44.0";
  j["bos_token_id"] = c.arch == nn::Arch::gpt2 ? 50256 : 128000;
  j["initializer_range"] = 0.02;
  if (c.arch == nn::Arch::gpt2) j["resid_pdrop"] = 0.1;
  return j.dump(2) + "\n";  // Python: json.dumps(d, indent=2, sort_keys=True) + "\n"
}

// Writes an HF directory the way Python's save_pretrained does: bf16
// tensors (fp32 buffers), files in Python safetensors' layout, metadata
// {"format": "pt"} (the Llama case adds a second key in non-sorted order).
// Returns the names of the files written.
std::set<std::string> write_python_style_dir(const fs::path& dir, const HfDirCase& hc, std::mt19937_64& rng) {
  fs::create_directories(dir);
  ckpt::NamedTensors all;
  for (const auto& [name, shape] : hf_tensor_list(hc)) all.emplace_back(name, test::random_tensor(shape, DType::bf16, rng));
  if (hc.lm_head_copy) {
    const std::string wte = hc.cfg.arch == nn::Arch::gpt2 ? (hc.prefix ? "transformer.wte.weight" : "wte.weight")
                                                          : "model.embed_tokens.weight";
    for (const auto& [name, t] : ckpt::NamedTensors(all))
      if (name == wte) all.emplace_back("lm_head.weight", t);
  }
  if (hc.buffers) {
    const int64_t T = hc.cfg.max_seq_len;
    for (int64_t i = 0; i < hc.cfg.n_layer; ++i) {
      const std::string h = std::string(hc.prefix ? "transformer." : "") + "h." + std::to_string(i) + ".";
      Tensor mask = Tensor::empty(Shape{1, 1, T, T}, DType::f32);
      for (int64_t r = 0; r < T; ++r)
        for (int64_t col = 0; col < T; ++col) mask.data<float>()[r * T + col] = col <= r ? 1.0f : 0.0f;
      Tensor masked_bias = Tensor::empty(Shape{}, DType::f32);
      masked_bias.data<float>()[0] = -1e4f;
      all.emplace_back(h + "attn.bias", mask);
      all.emplace_back(h + "attn.masked_bias", masked_bias);
    }
  }
  std::map<std::string, std::string> meta{{"format", "pt"}};
  ckpt::SafetensorsWriteOptions opt;
  opt.hf_layout = true;
  if (hc.cfg.arch == nn::Arch::llama3) {
    meta["source"] = "zettatron-test";
    opt.metadata_order = {"source", "format"};  // a Rust HashMap's order: not sorted
  }
  std::set<std::string> files{"config.json"};
  write_bytes(dir / "config.json", python_config_text(hc));
  if (!hc.sharded) {
    ckpt::write_safetensors((dir / "model.safetensors").string(), all, meta, opt);
    files.insert("model.safetensors");
    return files;
  }
  // Two shards: the first half of the tensors (in list order) and the rest.
  const size_t half = all.size() / 2;
  const ckpt::NamedTensors a(all.begin(), all.begin() + ptrdiff_t(half)), b(all.begin() + ptrdiff_t(half), all.end());
  json weight_map = json::object();
  int64_t total = 0;
  for (const auto& [part, fname] : {std::pair{&a, "model-00001-of-00002.safetensors"},
                                    std::pair{&b, "model-00002-of-00002.safetensors"}}) {
    ckpt::write_safetensors((dir / fname).string(), *part, meta, opt);
    files.insert(fname);
    for (const auto& [name, t] : *part) {
      weight_map[name] = fname;
      total += int64_t(t.nbytes());
    }
  }
  write_bytes(dir / "model.safetensors.index.json",
              json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
  files.insert("model.safetensors.index.json");
  return files;
}

class HfFormatRoundTrip : public ::testing::TestWithParam<HfDirCase> {};

TEST_P(HfFormatRoundTrip, HfToZettatronToHfIsByteIdentical) {
  ZT_TEST_TRACE_SEED();
  const HfDirCase& hc = GetParam();
  auto rng = test::make_rng(std::hash<std::string>{}(hc.name));
  const fs::path dir = temp_dir(hc.name);
  const std::set<std::string> files = write_python_style_dir(dir / "in", hc, rng);

  const HfModel m = read_hf_model((dir / "in").string());
  expect_same_network(m.config, hc.cfg);
  EXPECT_EQ(m.layout.at("prefix"), hc.prefix ? "transformer." : "");
  EXPECT_EQ(m.layout.at("buffers").size(), hc.buffers ? size_t(2 * hc.cfg.n_layer) : 0u);
  EXPECT_TRUE(m.layout.at("byte_identical").get<bool>());
  // The layout is plain JSON: it survives text (a checkpoint manifest).
  const json layout = json::parse(m.layout.dump());

  // Tensors as f32, the model would load them: a Transformer accepts them.
  nn::Transformer model(m.config, DType::f32);
  for (const auto& [name, t] : m.tensors) {
    ASSERT_EQ(model.param(name).shape(), t.shape()) << name;
    std::memcpy(model.param(name).data_ptr(), t.data_ptr(), t.nbytes());
  }
  // Export the model's own parameters (not m.tensors) with the recorded layout.
  write_hf_model((dir / "out").string(), m.config, model_tensors(model), layout);
  EXPECT_EQ(file_names(dir / "out"), files);
  for (const std::string& f : files) {
    const std::string want = read_bytes(dir / "in" / f), got = read_bytes(dir / "out" / f);
    EXPECT_EQ(got.size(), want.size()) << f;
    EXPECT_TRUE(got == want) << f << " is not byte-identical";
  }

  // A changed weight changes only the bytes of that tensor's values.
  const std::string probe = hc.cfg.arch == nn::Arch::gpt2 ? "layers.1.mlp.out.bias" : "layers.1.mlp_norm.weight";
  model.param(probe).data<float>()[3] += 1.0f;
  write_hf_model((dir / "changed").string(), m.config, model_tensors(model), layout);
  size_t differing_files = 0;
  for (const std::string& f : files) {
    const std::string want = read_bytes(dir / "in" / f), got = read_bytes(dir / "changed" / f);
    ASSERT_EQ(got.size(), want.size()) << f;
    size_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
    EXPECT_LE(diff, 2u) << f << ": one bf16 value changed";
    differing_files += diff > 0;
  }
  EXPECT_EQ(differing_files, 1u);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    HfFormat, HfFormatRoundTrip,
    ::testing::Values(HfDirCase{"gpt2_sharded_prefix_buffers", nn::model_preset("gpt2-tiny"), true, true, true, false},
                      HfDirCase{"gpt2_single", nn::model_preset("gpt2-tiny"), false, false, false, false},
                      HfDirCase{"gpt2_single_buffers_head_copy", nn::model_preset("gpt2-tiny"), false, false, true,
                                true},
                      HfDirCase{"llama_sharded", nn::model_preset("llama3-tiny"), true, false, false, false},
                      HfDirCase{"llama_single", nn::model_preset("llama3-tiny"), false, false, false, false},
                      HfDirCase{"mixtral_sharded", nn::model_preset("llama3-moe-tiny"), true, false, false, false},
                      HfDirCase{"llama_tied_sharded",
                                variant("llama3-tiny", [](nn::ModelConfig& c) { c.tied_embeddings = true; }), true,
                                false, false, false}),
    [](const auto& info) { return info.param.name; });

// Buffers that are neither GPT-2's causal mask nor small cannot be recorded:
// the export writes the files without them (and an index without them), and
// the layout says the copy is not byte-identical. A header that is not in
// the canonical form is reported the same way.
TEST(HfFormat, LayoutSaysWhenBytesCannotBeReproduced) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(23);
  const HfDirCase hc{"odd", nn::model_preset("gpt2-tiny"), true, true, true, false};
  const fs::path dir = temp_dir("odd_buffers");
  write_python_style_dir(dir / "in", hc, rng);
  // Replace layer 1's causal mask with random values (64 x 64 f32: 16 KiB).
  const std::string shard = json::parse(read_bytes(dir / "in" / "model.safetensors.index.json"))["weight_map"]
                                ["transformer.h.1.attn.bias"];
  {
    ckpt::NamedTensors t;
    std::map<std::string, std::string> meta;
    {
      const auto f = ckpt::SafetensorsFile::open((dir / "in" / shard).string());
      meta = f.metadata();
      for (const auto& [name, view] : f.tensors()) {
        Tensor c = name == "transformer.h.1.attn.bias" ? test::random_tensor(view.shape(), DType::f32, rng)
                                                       : Tensor::empty(view.shape(), view.dtype());
        if (name != "transformer.h.1.attn.bias") std::memcpy(c.data_ptr(), view.data_ptr(), view.nbytes());
        t.emplace_back(name, c);
      }
    }
    ckpt::write_safetensors((dir / "in" / shard).string(), t, meta, {.hf_layout = true});
  }
  const HfModel m = read_hf_model((dir / "in").string());
  EXPECT_FALSE(m.layout.at("byte_identical").get<bool>());
  EXPECT_EQ(m.layout.at("dropped_buffers"), json::array({"transformer.h.1.attn.bias"}));
  write_hf_model((dir / "out").string(), m.config, m.tensors, m.layout);
  const json index = json::parse(read_bytes(dir / "out" / "model.safetensors.index.json"));
  EXPECT_FALSE(index["weight_map"].contains("transformer.h.1.attn.bias"));
  EXPECT_TRUE(index["weight_map"].contains("transformer.h.0.attn.bias"));
  int64_t total = 0;
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    const auto sf = ckpt::SafetensorsFile::open((dir / "out" / f).string());
    EXPECT_FALSE(sf.contains("transformer.h.1.attn.bias"));
    for (const auto& [name, t] : sf.tensors()) total += int64_t(t.nbytes());
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  const HfModel again = read_hf_model((dir / "out").string());
  for (size_t i = 0; i < m.tensors.size(); ++i)
    EXPECT_EQ(std::memcmp(again.tensors[i].second.data_ptr(), m.tensors[i].second.data_ptr(),
                          m.tensors[i].second.nbytes()),
              0)
        << m.tensors[i].first;

  // A header with spaces after separators (valid, but not how Python writes it).
  const fs::path single = dir / "single";
  write_python_style_dir(single, HfDirCase{"single", nn::model_preset("gpt2-tiny"), false, false, false, false}, rng);
  const std::string bytes = read_bytes(single / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = json::parse(bytes.substr(8, n)).dump(1);  // other whitespace, same content
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n2 = header.size();
  write_bytes(single / "model.safetensors",
              std::string(reinterpret_cast<const char*>(&n2), 8) + header + bytes.substr(8 + n));
  const HfModel ws = read_hf_model(single.string());
  EXPECT_FALSE(ws.layout.at("files").at(0).at("canonical").get<bool>());
  EXPECT_FALSE(ws.layout.at("byte_identical").get<bool>());
  fs::remove_all(dir);
}

// --- bad input ------------------------------------------------------------------------

// A small exported model to break: llama3-tiny (f32) or gpt2-tiny.
fs::path exported(const std::string& name, const char* preset) {
  auto rng = test::make_rng(std::hash<std::string>{}(name));
  const nn::ModelConfig cfg = nn::model_preset(preset);
  nn::Transformer model(cfg, DType::f32);
  randomize(model, rng);
  const fs::path dir = temp_dir(name);
  write_hf_model((dir / "hf").string(), cfg, model_tensors(model), nullptr);
  return dir / "hf";
}

// Rewrites DIR/model.safetensors through edit(tensors).
void rewrite_weights(const fs::path& dir, void (*edit)(ckpt::NamedTensors&)) {
  ckpt::NamedTensors t;
  {
    const auto f = ckpt::SafetensorsFile::open((dir / "model.safetensors").string());
    for (const auto& [name, view] : f.tensors()) {  // own copies: the mapping goes away
      Tensor c = Tensor::empty(view.shape(), view.dtype());
      std::memcpy(c.data_ptr(), view.data_ptr(), view.nbytes());
      t.emplace_back(name, c);
    }
  }
  edit(t);
  ckpt::write_safetensors((dir / "model.safetensors").string(), t, {{"format", "pt"}}, {.hf_layout = true});
}

TEST(HfFormat, MissingTensorIsNamed) {
  const fs::path hf = exported("missing", "gpt2-tiny");
  rewrite_weights(hf, [](ckpt::NamedTensors& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "transformer.h.1.mlp.c_fc.bias"; });
  });
  const std::string msg = test::error_of([&] { read_hf_model(hf.string()); });
  EXPECT_CONTAINS(msg, "transformer.h.1.mlp.c_fc.bias: missing (expected shape (256))");
  fs::remove_all(hf.parent_path());
}

TEST(HfFormat, WrongShapeListsBothShapes) {
  const fs::path hf = exported("shape", "llama3-tiny");
  rewrite_weights(hf, [](ckpt::NamedTensors& t) {
    for (auto& [name, v] : t)
      if (name == "model.layers.0.self_attn.k_proj.weight") v = Tensor::empty(Shape{33, 64}, DType::f32);
  });
  const std::string msg = test::error_of([&] { read_hf_model(hf.string()); });
  EXPECT_CONTAINS(msg, "model.layers.0.self_attn.k_proj.weight: file has shape (33, 64), expected shape (32, 64)");
  fs::remove_all(hf.parent_path());
}

TEST(HfFormat, UnexpectedTensorAndBadDtypeAreNamed) {
  const fs::path hf = exported("extra", "llama3-tiny");
  rewrite_weights(hf, [](ckpt::NamedTensors& t) {
    t.emplace_back("model.layers.0.self_attn.q_proj.bias", Tensor::empty(Shape{64}, DType::f32));
    for (auto& [name, v] : t)
      if (name == "model.norm.weight") v = Tensor::empty(Shape{64}, DType::i32);
  });
  const std::string msg = test::error_of([&] { read_hf_model(hf.string()); });
  EXPECT_CONTAINS(msg, "model.layers.0.self_attn.q_proj.bias: unexpected tensor (in model.safetensors)");
  EXPECT_CONTAINS(msg, "model.norm.weight: dtype I32; supported: F32, BF16, F16");
  fs::remove_all(hf.parent_path());
}

// config.json edited through edit(json).
std::string config_error(const char* name, const char* preset, void (*edit)(json&)) {
  const fs::path hf = exported(name, preset);
  json j = json::parse(read_bytes(hf / "config.json"));
  edit(j);
  write_bytes(hf / "config.json", j.dump(2));
  const std::string msg = test::error_of([&] { read_hf_model(hf.string()); });
  fs::remove_all(hf.parent_path());
  return msg;
}

TEST(HfFormat, UnsupportedConfigsAreRefusedByKey) {
  std::string msg = config_error("mtype", "llama3-tiny", [](json& j) { j["model_type"] = "mistral"; });
  EXPECT_CONTAINS(msg, "key \"model_type\" is \"mistral\"; supported: \"gpt2\"");
  msg = config_error("act", "llama3-tiny", [](json& j) { j["hidden_act"] = "gelu"; });
  EXPECT_CONTAINS(msg, "key \"hidden_act\" is \"gelu\"; supported: \"silu\"");
  msg = config_error("bias", "llama3-tiny", [](json& j) { j["attention_bias"] = true; });
  EXPECT_CONTAINS(msg, "key \"attention_bias\" is true");
  msg = config_error("headdim", "llama3-tiny", [](json& j) { j["head_dim"] = 32; });
  EXPECT_CONTAINS(msg, "key \"head_dim\" is 32 but hidden_size / num_attention_heads = 64 / 4");
  msg = config_error("rope", "llama3-tiny", [](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
  EXPECT_CONTAINS(msg, "rope_type \"yarn\"");
  msg = config_error("gelu", "gpt2-tiny", [](json& j) { j["activation_function"] = "relu"; });
  EXPECT_CONTAINS(msg, "key \"activation_function\" is \"relu\"");
  msg = config_error("nokey", "gpt2-tiny", [](json& j) { j.erase("n_embd"); });
  EXPECT_CONTAINS(msg, "key \"n_embd\" is missing");
  msg = config_error("window", "llama3-moe-tiny", [](json& j) { j["sliding_window"] = 16; });
  EXPECT_CONTAINS(msg, "key \"sliding_window\" is 16 but Zettatron's attention is full causal attention");
  msg = config_error("jitter", "llama3-moe-tiny", [](json& j) { j["router_jitter_noise"] = 0.01; });
  EXPECT_CONTAINS(msg, "key \"router_jitter_noise\" is 0.01");
  msg = config_error("topk", "llama3-moe-tiny", [](json& j) { j["num_experts_per_tok"] = 5; });
  EXPECT_CONTAINS(msg, "model.expert_top_k = 5 must be in [1, n_expert = 4]");
  msg = config_error("noexperts", "llama3-moe-tiny", [](json& j) { j.erase("num_local_experts"); });
  EXPECT_CONTAINS(msg, "key \"num_local_experts\" is missing");
  // A router Mixtral cannot express is refused on export.
  nn::ModelConfig softmax_weights = nn::model_preset("llama3-moe-tiny");
  softmax_weights.expert_normalize = false;
  nn::Transformer model(softmax_weights, DType::f32);
  const fs::path dir = temp_dir("softmax_weights");
  EXPECT_CONTAINS(test::error_of([&] { write_hf_model((dir / "hf").string(), softmax_weights, model_tensors(model), nullptr); }),
                  "model.expert_normalize = false (the softmax probabilities as routing weights) has no "
                  "MixtralForCausalLM equivalent");
  // So is a shared expert, and nothing is written.
  nn::ModelConfig shared = nn::model_preset("llama3-moe-tiny");
  shared.shared_expert_ff = 32;
  nn::Transformer with_shared(shared, DType::f32);
  EXPECT_CONTAINS(test::error_of([&] { write_hf_model((dir / "shared").string(), shared, model_tensors(with_shared), nullptr); }),
                  "MixtralForCausalLM has no shared expert, but model.shared_expert_ff = 32");
  EXPECT_FALSE(fs::exists(dir / "shared"));
  fs::remove_all(dir);
}

TEST(HfFormat, ExportNeverOverwrites) {
  const fs::path hf = exported("notempty", "gpt2-tiny");
  const HfModel m = read_hf_model(hf.string());
  const fs::path out = hf.parent_path() / "out";
  fs::create_directories(out);
  write_bytes(out / "keep.txt", "mine");
  std::string msg = test::error_of([&] { write_hf_model(out.string(), m.config, m.tensors, m.layout); });
  EXPECT_CONTAINS(msg, "is not empty");
  EXPECT_EQ(file_names(out), std::set<std::string>{"keep.txt"});
  EXPECT_EQ(read_bytes(out / "keep.txt"), "mine");
  // Exporting into the source directory is refused the same way.
  msg = test::error_of([&] { write_hf_model(hf.string(), m.config, m.tensors, nullptr); });
  EXPECT_CONTAINS(msg, "is not empty");
  fs::remove_all(hf.parent_path());
}

TEST(HfFormat, ExportChecksTensorsAndLayout) {
  const fs::path hf = exported("export_checks", "llama3-tiny");
  HfModel m = read_hf_model(hf.string());
  const fs::path root = hf.parent_path();
  // A layout describing another model.
  nn::ModelConfig other = m.config;
  other.d_ff = 128;
  nn::Transformer model(other, DType::f32);
  std::string msg =
      test::error_of([&] { write_hf_model((root / "a").string(), other, model_tensors(model), m.layout); });
  EXPECT_CONTAINS(msg, "layout describes another model (d_ff 160 vs 128)");
  // A missing and a mis-shaped tensor.
  auto t = m.tensors;
  t.erase(t.begin() + 1);
  t[0].second = Tensor::empty(Shape{3, 64}, DType::f32);
  msg = test::error_of([&] { write_hf_model((root / "b").string(), m.config, t, nullptr); });
  EXPECT_CONTAINS(msg, "layers.0.attn_norm.weight: missing (expected shape (64))");
  EXPECT_CONTAINS(msg, "embed.wte: got f32(3, 64) on cpu, expected a float tensor of shape (512, 64)");
  EXPECT_FALSE(fs::exists(root / "b")) << "nothing is created when the arguments are wrong";
  fs::remove_all(root);
}

}  // namespace
}  // namespace zt::train
