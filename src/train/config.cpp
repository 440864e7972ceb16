#include "train/config.h"

#include "comm/process_group.h"
#include "nn/tensor_parallel.h"
#include "ops/device.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <toml++/toml.h>
#include <variant>

#include "core/device.h"
#include "core/error.h"

namespace zt::train {

namespace {

// A pointer to the storage of one config value.
using Ref = std::variant<int64_t*, double*, float*, bool*, std::string*, nn::Arch*>;

struct Field {
  const char* section;
  const char* key;
  Ref (*ref)(Config&);
  const char* doc;
  std::string name() const { return std::string(section) + "." + key; }
};

#define ZT_F(sec, key, expr, doc) Field{sec, key, [](Config& c) -> Ref { return &c.expr; }, doc}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      ZT_F("model", "arch", model.arch, "gpt2 | llama3"),
      ZT_F("model", "vocab_size", model.vocab_size, "real vocabulary size"),
      ZT_F("model", "vocab_multiple", model.vocab_multiple, "embedding rows padded to a multiple of this"),
      ZT_F("model", "n_layer", model.n_layer, "transformer blocks"),
      ZT_F("model", "d_model", model.d_model, "width C"),
      ZT_F("model", "n_head", model.n_head, "query heads"),
      ZT_F("model", "n_kv_head", model.n_kv_head, "key/value heads (grouped-query attention)"),
      ZT_F("model", "d_ff", model.d_ff, "MLP hidden width"),
      ZT_F("model", "max_seq_len", model.max_seq_len, "context length (positions / RoPE table)"),
      ZT_F("model", "norm_eps", model.norm_eps, "LayerNorm/RMSNorm epsilon"),
      ZT_F("model", "rope_theta", model.rope_theta, "RoPE base (llama3)"),
      ZT_F("model", "rope_scaling", model.rope_scaling.enabled, "Llama 3 RoPE frequency scaling"),
      ZT_F("model", "rope_scaling_factor", model.rope_scaling.factor, "Llama 3 scaling factor"),
      ZT_F("model", "rope_low_freq_factor", model.rope_scaling.low_freq_factor, "Llama 3 scaling"),
      ZT_F("model", "rope_high_freq_factor", model.rope_scaling.high_freq_factor, "Llama 3 scaling"),
      ZT_F("model", "rope_original_max_position", model.rope_scaling.original_max_position, "Llama 3 scaling"),
      ZT_F("model", "tied_embeddings", model.tied_embeddings, "LM head shares the token embedding"),
      ZT_F("model", "init_std", model.init_std, "init N(0, std); residual projections / sqrt(2 L)"),
      ZT_F("model", "n_expert", model.n_expert, "mixture of experts: experts per block's MLP (0: a dense MLP; llama3)"),
      ZT_F("model", "expert_top_k", model.expert_top_k, "experts each token is routed to"),
      ZT_F("model", "expert_normalize", model.expert_normalize,
           "the top-k routing weights renormalised to sum 1 (Mixtral); false keeps the softmax probabilities"),
      ZT_F("model", "router_aux_loss", model.router_aux_loss,
           "load-balancing loss coefficient (Switch: E sum_e f_e P_e per block; 0: none)"),
      ZT_F("model", "router_z_loss", model.router_z_loss,
           "router z-loss coefficient (ST-MoE: mean over tokens of logsumexp(router logits)^2 per block; 0: none)"),
      ZT_F("model", "shared_expert_ff", model.shared_expert_ff,
           "hidden width of a shared SwiGLU expert every token goes through beside its routed ones (0: none)"),
      ZT_F("model", "router_bias_update_rate", model.router_bias_update_rate,
           "aux-loss-free balancing (DeepSeek-V3): each step, every expert's routing bias +- this rate "
           "towards the mean load (0: none)"),
      ZT_F("model", "expert_capacity_factor", model.expert_capacity_factor,
           "each expert takes at most ceil(factor x N k / E) of a micro-batch's N tokens' slots, the first come; "
           "the rest are dropped (0: dropless)"),
      ZT_F("data", "dir", data.dir, "prepared token shards (zettatron prepare)"),
      ZT_F("data", "blend", data.blend,
           "instead of dir, a weighted mix of prepared datasets: \"DIR WEIGHT, DIR WEIGHT, ...\" (weights "
           "normalised; each dataset shuffled on its own, a small one repeating)"),
      ZT_F("data", "tokenizer", data.tokenizer, "gpt2 | llama3 | path (decoding samples)"),
      ZT_F("train", "device", train.device, "cpu | cuda[:N] | auto (cuda when this machine has a usable GPU, else cpu)"),
      ZT_F("train", "dtype", train.dtype, "f32 | bf16 | f16 (CUDA only; dynamic loss scaling) - master weights stay f32"),
      ZT_F("train", "seq_len", train.seq_len, "tokens per sequence T"),
      ZT_F("train", "global_batch", train.global_batch, "sequences per optimizer step"),
      ZT_F("train", "micro_batch", train.micro_batch, "sequences per forward/backward"),
      ZT_F("train", "steps", train.steps, "optimizer steps"),
      ZT_F("train", "seed", train.seed, "initialisation and data order"),
      ZT_F("train", "recompute", train.recompute, "none | selective | full"),
      ZT_F("train", "offload_activations", train.offload_activations,
           "move what each block keeps for its backward to host memory after its forward, and back before its "
           "backward"),
      ZT_F("train", "fp8", train.fp8,
           "the blocks' linear layers on per-tensor-scaled fp8: E4M3 activations and weights, E5M2 gradients (on "
           "a GPU the fp8 tensor cores; on the CPU fp8's numerics in f32 products)"),
      ZT_F("train", "deterministic", train.deterministic,
           "the same bits on every run (default); false lets a GPU's attention backward sum dq with atomics instead "
           "of writing and re-reading every head's (T, T) score gradients, and each matmul shape keep the fastest of "
           "cuBLASLt's algorithms and cuBLAS's own GEMM by timing them; a run no longer repeats bit for bit"),
      ZT_F("train", "eval_every", train.eval_every, "steps between evaluations (0: never)"),
      ZT_F("train", "eval_batches", train.eval_batches, "validation micro-batches per evaluation"),
      ZT_F("train", "eval_each_dataset", train.eval_each_dataset,
           "with data.blend: each evaluation also takes every dataset's validation loss alone (eval_batches each)"),
      ZT_F("train", "sample_every", train.sample_every, "steps between samples (0: at the end only)"),
      ZT_F("train", "log_every", train.log_every, "steps between console lines"),
      ZT_F("train", "run_dir", train.run_dir, "output directory"),
      ZT_F("train", "max_bad_steps", train.max_bad_steps, "consecutive non-finite losses before stopping"),
      ZT_F("train", "loss_scale", train.loss_scale, "auto (dynamic for fp16, else off) | dynamic | off"),
      ZT_F("train", "loss_scale_init", train.loss_scale_init, "first dynamic loss scale (a power of two)"),
      ZT_F("train", "loss_scale_window", train.loss_scale_window, "steps without overflow before the scale doubles"),
      ZT_F("optim", "lr", optim.lr, "peak learning rate"),
      ZT_F("optim", "min_lr", optim.min_lr, "learning-rate floor"),
      ZT_F("optim", "schedule", optim.schedule, "cosine | wsd | constant"),
      ZT_F("optim", "warmup_steps", optim.warmup_steps, "linear warmup steps"),
      ZT_F("optim", "decay_steps", optim.decay_steps, "wsd: final decay steps"),
      ZT_F("optim", "beta1", optim.beta1, "AdamW beta1"),
      ZT_F("optim", "beta2", optim.beta2, "AdamW beta2"),
      ZT_F("optim", "eps", optim.eps, "AdamW epsilon"),
      ZT_F("optim", "weight_decay", optim.weight_decay, "decoupled weight decay"),
      ZT_F("optim", "decay_embeddings", optim.decay_embeddings, "apply weight decay to embeddings too"),
      ZT_F("optim", "stochastic_rounding", optim.stochastic_rounding,
           "round the bf16 weights from the f32 master stochastically (unbiased) instead of to nearest"),
      ZT_F("optim", "offload", optim.offload,
           "keep the f32 master weights and AdamW's moments in host memory and update them on the host's cores"),
      ZT_F("optim", "grad_clip", optim.grad_clip, "max global gradient norm (0: off)"),
      ZT_F("sample", "prompt", sample.prompt, "prompt text (empty: end-of-text token)"),
      ZT_F("sample", "tokens", sample.tokens, "tokens per sample"),
      ZT_F("sample", "temperature", sample.temperature, "softmax temperature (0: the most likely token)"),
      ZT_F("sample", "top_k", sample.top_k, "keep the k most likely tokens (0: all)"),
      ZT_F("sample", "top_p", sample.top_p,
           "keep the most likely tokens whose probabilities sum to this (nucleus sampling; 1: all)"),
      ZT_F("sample", "count", sample.count, "samples per sampling point"),
      ZT_F("metrics", "peak_gflops", metrics.peak_gflops, "device peak for MFU (0: measure sgemm on CPU)"),
      ZT_F("metrics", "pipeline_trace_step", metrics.pipeline_trace_step, "with pp > 1: write RUN_DIR/pipeline_trace.json (Chrome trace, open in Perfetto) of this step (0: none)"),
      ZT_F("metrics", "trace_step", metrics.trace_step, "write RUN_DIR/trace.json (Chrome trace, open in Perfetto): this step's phases, ops and communication on every rank (0: none)"),
      ZT_F("metrics", "profiler_capture_step", metrics.profiler_capture_step, "on a GPU: a profiler started with capture off (ncu --profile-from-start off, nsys --capture-range=cudaProfilerApi) records this step's kernels alone (0: none)"),
      ZT_F("metrics", "op_profile", metrics.op_profile, "time every op (GPU: events) and report the time per op in metrics.jsonl and at the end"),
      ZT_F("parallel", "dp", parallel.dp, "data-parallel size (0: every process not used by tp x pp x cp)"),
      ZT_F("parallel", "tp", parallel.tp, "tensor-parallel size"),
      ZT_F("parallel", "sequence_parallel", parallel.sequence_parallel, "with tp > 1: shard norms and residuals along the tokens (activation memory of those regions / tp)"),
      ZT_F("parallel", "pp", parallel.pp, "pipeline-parallel size"),
      ZT_F("parallel", "pp_schedule", parallel.pp_schedule, "pipeline schedule: afab | 1f1b | interleaved | zb"),
      ZT_F("parallel", "virtual_stages", parallel.virtual_stages, "model chunks per pipeline rank (interleaved)"),
      ZT_F("parallel", "pp_layers", parallel.pp_layers, "blocks per pipeline stage, e.g. \"4,4,3,3\" (empty: balanced by cost)"),
      ZT_F("parallel", "cp", parallel.cp, "context-parallel size"),
      ZT_F("parallel", "ep", parallel.ep, "expert-parallel size: ranks the experts of a mixture-of-experts model are split over (divides n_expert and dp x cp)"),
      ZT_F("parallel", "zero_stage", parallel.zero_stage, "0: replicate; 1: shard optimizer state; 2: and gradients; 3: and parameters"),
      ZT_F("parallel", "shard_group", parallel.shard_group, "ZeRO shards span groups of this many dp ranks, replicated across groups (HSDP; 0: all of dp)"),
      ZT_F("parallel", "bucket_mb", parallel.bucket_mb, "gradient reduction bucket size in MiB"),
      ZT_F("parallel", "comm_backend", parallel.comm_backend, "auto (mpi under mpirun/srun; GPU tensors over NCCL when train.device = cuda and there are several processes) | mpi (GPU tensors staged through host memory: slow; processes may share a GPU) | solo | nccl (GPU tensors over NCCL even for one process)"),
      ZT_F("parallel", "comm_timeout", parallel.comm_timeout, "seconds before a stuck collective ends the job"),
      ZT_F("checkpoint", "every", checkpoint.every, "steps between checkpoints (0: none); the last step is saved too"),
      ZT_F("checkpoint", "keep_last", checkpoint.keep_last, "checkpoints kept, newest first (0: all)"),
      ZT_F("checkpoint", "keep_every", checkpoint.keep_every, "steps that are multiples of this are kept for good (0: none)"),
      ZT_F("checkpoint", "async", checkpoint.async, "write in the background while training goes on"),
      ZT_F("checkpoint", "dir", checkpoint.dir, "where checkpoints go (empty: RUN_DIR/checkpoints)"),
  };
  return f;
}
#undef ZT_F

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The valid name closest to `name` (by edit distance; ties: the first).
std::string closest(const std::string& name, const std::vector<std::string>& valid) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& v : valid) {
    // Compare against both the full name and the bare key, so a key put in
    // the wrong section still finds its home.
    const size_t dot = v.find('.');
    const std::string bare = dot == std::string::npos ? v : v.substr(dot + 1);
    const size_t name_dot = name.find('.');
    const std::string name_bare = name_dot == std::string::npos ? name : name.substr(name_dot + 1);
    const size_t d = std::min(edit_distance(name, v), edit_distance(name_bare, bare));
    if (d < best_d) {
      best_d = d;
      best = v;
    }
  }
  return best;
}

std::string node_desc(const toml::node& n) {
  std::ostringstream os;
  os << n.type();
  n.visit([&](auto&& v) {
    if constexpr (toml::is_value<decltype(v)>) os << " " << v;
  });
  return os.str();
}

void assign(const Field& f, Config& c, const toml::node& n, const std::string& origin) {
  const std::string where = origin + ": " + f.name();
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          ZT_CHECK(n.is_integer(), where, " must be an integer, got ", node_desc(n));
          *p = n.value<int64_t>().value();
        } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
          ZT_CHECK(n.is_number(), where, " must be a number, got ", node_desc(n));
          *p = T(n.value<double>().value());
        } else if constexpr (std::is_same_v<T, bool>) {
          ZT_CHECK(n.is_boolean(), where, " must be true or false, got ", node_desc(n));
          *p = n.value<bool>().value();
        } else if constexpr (std::is_same_v<T, std::string>) {
          ZT_CHECK(n.is_string(), where, " must be a string, got ", node_desc(n));
          *p = n.value<std::string>().value();
        } else {
          ZT_CHECK(n.is_string(), where, " must be a string, got ", node_desc(n));
          *p = nn::parse_arch(n.value<std::string>().value());
        }
      },
      f.ref(c));
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const Field& f : fields())
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

// "section.key=value" -> inserted into the table (value as TOML, else a string).
void apply_override(toml::table& tbl, const std::string& ov) {
  const size_t eq = ov.find('=');
  ZT_CHECK(eq != std::string::npos, "--set '", ov, "' must look like section.key=value");
  const std::string name = ov.substr(0, eq), value = ov.substr(eq + 1);
  const size_t dot = name.find('.');
  ZT_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < name.size(), "--set '", ov,
           "': the key must be section.key (e.g. train.steps)");
  const std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  if (!find_field(section, key) && !(section == "model" && key == "preset"))
    ZT_FAIL("--set: unknown config key '", name, "'; did you mean '", closest(name, config_keys()), "'?");
  if (!tbl.contains(section)) tbl.insert(section, toml::table{});
  toml::table* sec = tbl[section].as_table();
  ZT_CHECK(sec != nullptr, "--set '", ov, "': '", section, "' is not a table in the config file");
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    sec->insert_or_assign(key, value);  // a bare string, e.g. --set data.dir=runs/x
    return;
  }
  const toml::node& v = *parsed.get("v");
  if (v.is_integer())
    sec->insert_or_assign(key, v.value<int64_t>().value());
  else if (v.is_floating_point())
    sec->insert_or_assign(key, v.value<double>().value());
  else if (v.is_boolean())
    sec->insert_or_assign(key, v.value<bool>().value());
  else if (v.is_string())
    sec->insert_or_assign(key, v.value<std::string>().value());
  else
    ZT_FAIL("--set '", ov, "': only integers, numbers, booleans and strings can be set");
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> keys{"model.preset"};
  for (const Field& f : fields()) keys.push_back(f.name());
  return keys;
}

namespace {

// check_all: Config::validate(); else only the model (a config stored in a
// checkpoint, whose data and run settings may not apply here).
Config parse_toml(const std::string& toml_text, const std::string& origin, const std::vector<std::string>& overrides,
                  bool check_all) {
  toml::table tbl;
  try {
    tbl = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << e.description() << " (line " << e.source().begin.line << ", column " << e.source().begin.column << ")";
    ZT_FAIL(origin, ": not valid TOML: ", os.str());
  }
  for (const std::string& ov : overrides) apply_override(tbl, ov);

  Config c;
  // The preset first: it sets every model field, the keys below override it.
  if (const toml::table* model = tbl["model"].as_table()) {
    if (const toml::node* preset = model->get("preset")) {
      ZT_CHECK(preset->is_string(), origin, ": model.preset must be a string, got ", node_desc(*preset));
      c.model_preset = preset->value<std::string>().value();
      c.model = nn::model_preset(c.model_preset);
    }
  }
  std::vector<std::string> sections;
  for (const Field& f : fields())
    if (std::find(sections.begin(), sections.end(), f.section) == sections.end()) sections.push_back(f.section);
  for (auto&& [sec_key, sec_node] : tbl) {
    const std::string section(sec_key.str());
    if (std::find(sections.begin(), sections.end(), section) == sections.end())
      ZT_FAIL(origin, ": unknown config section [", section, "]; valid sections: model, data, train, optim, sample, metrics, parallel, checkpoint");
    const toml::table* sec = sec_node.as_table();
    ZT_CHECK(sec != nullptr, origin, ": '", section, "' must be a table ([", section, "])");
    for (auto&& [key_node, value] : *sec) {
      const std::string key(key_node.str());
      if (section == "model" && key == "preset") continue;
      const Field* f = find_field(section, key);
      if (!f) {
        const std::string name = section + "." + key;
        ZT_FAIL(origin, ": unknown config key '", name, "'; did you mean '", closest(name, config_keys()), "'?");
      }
      assign(*f, c, value, origin);
    }
  }
  // GPT-2 has no grouped-query attention: unless the file sets n_kv_head, it
  // follows n_head (so `n_head = 6` on a gpt2 preset just works).
  const toml::table* model_tbl = tbl["model"].as_table();
  if (c.model.arch == nn::Arch::gpt2 && !(model_tbl && model_tbl->contains("n_kv_head")))
    c.model.n_kv_head = c.model.n_head;
  // "auto": this machine's GPU when it has a usable one, else the CPU, so one
  // config trains wherever it runs (resolved here: the rest sees cpu or cuda).
  c.train.device = resolve_auto_device(c.train.device);
  if (check_all)
    c.validate();
  else
    c.model.validate();
  return c;
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  return parse_toml(toml_text, origin, overrides, true);
}

Config parse_saved_config(const std::string& toml_text, const std::string& origin) {
  return parse_toml(toml_text, origin, {}, false);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  ZT_CHECK(in.good(), "cannot open config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

namespace {

// A field's value in c as TOML.
std::string toml_value(const Field& f, Config& c) {
  std::ostringstream os;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          os << toml_string(*p);
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (*p ? "true" : "false");
        } else if constexpr (std::is_same_v<T, nn::Arch>) {
          os << toml_string(std::string(nn::arch_name(*p)));
        } else if constexpr (std::is_same_v<T, int64_t>) {
          os << *p;
        } else {
          // The shortest text that reads back as the same value of the field's own type.
          char buf[64];
          const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, *p, std::chars_format::general);
          std::string s(buf, r.ptr);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
          os << s;
        }
      },
      f.ref(c));
  return os.str();
}

}  // namespace

std::string to_toml(const Config& c_in) {
  Config c = c_in;
  std::ostringstream os;
  const char* section = "";
  for (const Field& f : fields()) {
    if (std::string(section) != f.section) {
      section = f.section;
      os << (os.tellp() > 0 ? "\n" : "") << "[" << section << "]\n";
      if (std::string(section) == "model" && !c.model_preset.empty())
        os << "preset = " << toml_string(c.model_preset) << "\n";
    }
    os << f.key << " = " << toml_value(f, c) << "  # " << f.doc << "\n";
  }
  return os.str();
}

std::vector<std::string> changed_settings(const Config& before_in, const Config& after_in) {
  Config before = before_in, after = after_in;
  std::vector<std::string> out;
  if (before.model_preset != after.model_preset)
    out.push_back("model.preset: " + toml_string(before.model_preset) + " -> " + toml_string(after.model_preset));
  for (const Field& f : fields()) {
    const std::string a = toml_value(f, before), b = toml_value(f, after);
    if (a != b) out.push_back(std::string(f.section) + "." + f.key + ": " + a + " -> " + b);
  }
  return out;
}

DType Config::compute_dtype() const {
  const DType d = parse_dtype(train.dtype);
  ZT_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, "train.dtype = \"", train.dtype,
           "\" is not supported; use \"f32\", \"bf16\" or (on GPUs) \"f16\"");
  ZT_CHECK(d != DType::f16 || parse_device(train.device).is_cuda(), "train.dtype = \"", train.dtype,
           "\" runs on CUDA devices only (the CPU kernels compute in f32 or bf16); on train.device = \"",
           train.device, "\" use bf16 (no loss scaling needed) or f32");
  return d;
}

nn::Recompute Config::recompute() const { return nn::parse_recompute(train.recompute); }

std::optional<optim::LossScaleConfig> Config::loss_scaling() const {
  ZT_CHECK(train.loss_scale == "auto" || train.loss_scale == "dynamic" || train.loss_scale == "off",
           "train.loss_scale = \"", train.loss_scale, "\" is not a choice: use auto (dynamic for fp16), dynamic or off");
  const bool on = train.loss_scale == "dynamic" || (train.loss_scale == "auto" && compute_dtype() == DType::f16);
  if (!on) return std::nullopt;
  optim::LossScaleConfig c;
  c.init = train.loss_scale_init;
  c.window = train.loss_scale_window;
  optim::LossScaler check(c);  // throws naming a bad setting
  return c;
}

optim::LrSchedule Config::lr_schedule() const {
  optim::LrSchedule s;
  s.kind = optim::parse_lr_schedule(optim.schedule);
  s.lr = optim.lr;
  s.min_lr = optim.min_lr;
  s.warmup_steps = optim.warmup_steps;
  s.total_steps = train.steps;
  s.decay_steps = optim.decay_steps;
  return s;
}

optim::AdamWConfig Config::adamw() const {
  optim::AdamWConfig a;
  a.beta1 = optim.beta1;
  a.beta2 = optim.beta2;
  a.eps = optim.eps;
  a.weight_decay = optim.weight_decay;
  a.decay_embeddings = optim.decay_embeddings;
  a.stochastic_rounding = optim.stochastic_rounding;
  a.offload = optim.offload;
  a.seed = uint64_t(train.seed);
  return a;
}

void Config::check_layout(const parallel::MeshShape& mesh) const {
  ZT_CHECK(train.global_batch % (train.micro_batch * mesh.dp) == 0, "train.global_batch = ", train.global_batch,
           " is not divisible by micro_batch x dp = ", train.micro_batch, " x ", mesh.dp,
           "; each data-parallel rank runs global_batch / dp sequences in micro-batches");
  if (mesh.pp > 1)
    parallel::check_pipeline_schedule(parallel::parse_pipeline_schedule(parallel.pp_schedule),
                                      {mesh.pp, grad_accum_steps(mesh.dp), parallel.virtual_stages});
}

void Config::validate() const {
  model.validate();
  try {
    parse_device(train.device);
  } catch (const Error&) {
    ZT_FAIL("train.device = \"", train.device, "\" is not a device: use \"cpu\", \"cuda\", \"cuda:N\" or \"auto\" "
            "(a GPU when there is one)");
  }
  compute_dtype();
  ZT_CHECK(!optim.stochastic_rounding || compute_dtype() == DType::bf16, "optim.stochastic_rounding rounds bf16 "
           "weights from their f32 master, but train.dtype = \"", train.dtype, "\" has ",
           compute_dtype() == DType::f32 ? "no rounded copy (f32 weights are their own master)" : "f16 weights",
           "; set train.dtype = \"bf16\" or optim.stochastic_rounding = false");
  recompute();
  loss_scaling();
  lr_schedule().validate();
  ZT_CHECK(train.seq_len > 0, "train.seq_len must be positive, got ", train.seq_len);
  ZT_CHECK(train.seq_len <= model.max_seq_len, "train.seq_len = ", train.seq_len,
           " is longer than the model's context model.max_seq_len = ", model.max_seq_len,
           "; lower train.seq_len or raise model.max_seq_len");
  ZT_CHECK(train.micro_batch > 0 && train.global_batch > 0, "train.micro_batch and train.global_batch must be positive");
  ZT_CHECK(train.global_batch % train.micro_batch == 0, "train.global_batch = ", train.global_batch,
           " is not divisible by train.micro_batch = ", train.micro_batch,
           "; make global_batch a multiple of micro_batch (gradient accumulation steps = global / micro)");
  ZT_CHECK(train.steps > 0, "train.steps must be positive, got ", train.steps);
  ZT_CHECK(train.eval_every >= 0 && train.sample_every >= 0 && train.log_every > 0,
           "train.eval_every and train.sample_every must be >= 0 and train.log_every > 0");
  ZT_CHECK(train.eval_batches > 0, "train.eval_batches must be positive");
  ZT_CHECK(train.max_bad_steps > 0, "train.max_bad_steps must be positive");
  ZT_CHECK(!data.dir.empty() || !data.blend.empty(),
           "data.dir is empty: point it at a prepared dataset (zettatron prepare --output DIR), or list several in "
           "data.blend");
  ZT_CHECK(data.dir.empty() || data.blend.empty(), "data.dir = \"", data.dir, "\" and data.blend = \"", data.blend,
           "\" are both set; train on one dataset (data.dir) or a mix (data.blend), not both");
  data_parts();  // a malformed blend is named here
  ZT_CHECK(!train.eval_each_dataset || !data.blend.empty(), "train.eval_each_dataset takes each dataset of a "
           "blend alone, but data.blend is not set (one dataset's loss is val_loss); set it false or list the "
           "datasets in data.blend");
  ZT_CHECK(optim.beta1 >= 0 && optim.beta1 < 1 && optim.beta2 >= 0 && optim.beta2 < 1,
           "optim.beta1 and optim.beta2 must be in [0, 1)");
  ZT_CHECK(optim.eps > 0, "optim.eps must be positive");
  ZT_CHECK(optim.weight_decay >= 0, "optim.weight_decay must be >= 0");
  ZT_CHECK(optim.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 disables clipping)");
  ZT_CHECK(sample.temperature >= 0 && std::isfinite(sample.temperature),
           "sample.temperature must be >= 0 (0: the most likely token), got ", sample.temperature);
  ZT_CHECK(sample.top_p > 0 && sample.top_p <= 1, "sample.top_p must be in (0, 1] (1: no nucleus filtering), got ",
           sample.top_p);
  ZT_CHECK(sample.top_k >= 0 && sample.tokens >= 0 && sample.count >= 0,
           "sample.top_k, sample.tokens and sample.count must be >= 0");
  ZT_CHECK(metrics.peak_gflops >= 0, "metrics.peak_gflops must be >= 0");
  ZT_CHECK(metrics.pipeline_trace_step >= 0, "metrics.pipeline_trace_step must be >= 0 (0: no trace)");
  ZT_CHECK(metrics.trace_step >= 0, "metrics.trace_step must be >= 0 (0: no trace)");
  for (const auto& [key, step] : {std::pair<const char*, int64_t>{"trace_step", metrics.trace_step},
                                  {"pipeline_trace_step", metrics.pipeline_trace_step}})
    ZT_CHECK(step <= train.steps, "metrics.", key, " = ", step, " comes after the run's last step (train.steps = ",
             train.steps, "), so no trace would be written; pick a step from 1 to ", train.steps, ", or 0 for none");
  ZT_CHECK(metrics.profiler_capture_step >= 0, "metrics.profiler_capture_step must be >= 0 (0: no capture), not ",
           metrics.profiler_capture_step);
  ZT_CHECK(metrics.profiler_capture_step <= train.steps, "metrics.profiler_capture_step = ",
           metrics.profiler_capture_step, " comes after the run's last step (train.steps = ", train.steps,
           "), so nothing would be captured; pick a step from 1 to ", train.steps, ", or 0 for none");
  ZT_CHECK(parallel.dp >= 0 && parallel.tp >= 1 && parallel.pp >= 1 && parallel.cp >= 1 && parallel.ep >= 1,
           "parallel sizes must be >= 1 (parallel.dp may be 0: the rest of the processes)");
  ZT_CHECK(parallel.ep == 1 || model.moe(), "parallel.ep = ", parallel.ep,
           " splits the experts of a mixture-of-experts model, but model.n_expert = 0 (a dense MLP); set "
           "parallel.ep = 1 or give the model experts");
  ZT_CHECK(parallel.ep == 1 || model.n_expert % parallel.ep == 0, "parallel.ep = ", parallel.ep,
           " must divide model.n_expert = ", model.n_expert, " (each rank holds n_expert / ep experts of every block)");
  if (parallel.cp > 1) {
    ZT_CHECK(train.seq_len % (2 * parallel.cp) == 0, "parallel.cp = ", parallel.cp, " cuts each sequence into 2 cp = ",
             2 * parallel.cp, " equal chunks (two per rank, for balance), but train.seq_len = ", train.seq_len,
             " is not a multiple of ", 2 * parallel.cp, "; change one of them");
  }
  const parallel::PipelineSchedule schedule = parallel::parse_pipeline_schedule(parallel.pp_schedule);
  ZT_CHECK(parallel.virtual_stages >= 1, "parallel.virtual_stages must be >= 1");
  ZT_CHECK(parallel.virtual_stages == 1 || parallel.pp > 1, "parallel.virtual_stages = ", parallel.virtual_stages,
           " splits each pipeline rank's layers into chunks: it needs parallel.pp > 1");
  if (parallel.pp > 1) {
    // The micro-batch count depends on dp; the trainer checks it against the schedule.
    parallel::check_pipeline_schedule(schedule, {parallel.pp, std::max<int64_t>(parallel.pp, 1), parallel.virtual_stages});
    parallel::plan_pipeline_stages(model, train.seq_len, parallel.pp * parallel.virtual_stages,
                                   parallel::parse_stage_layers(parallel.pp_layers));
  }
  nn::check_tensor_parallel(model, parallel.tp);
  ZT_CHECK(!parallel.sequence_parallel || (train.micro_batch * train.seq_len) % parallel.tp == 0,
           "parallel.sequence_parallel shards the micro_batch x seq_len = ", train.micro_batch * train.seq_len,
           " tokens of a micro-batch over tp = ", parallel.tp, " ranks: make it a multiple of tp");
  ZT_CHECK(parallel.zero_stage >= 0 && parallel.zero_stage <= 3, "parallel.zero_stage = ", parallel.zero_stage,
           " does not exist: 0 (replicated), 1 (optimizer state sharded), 2 (and gradients), 3 (and parameters)");
  ZT_CHECK(parallel.bucket_mb > 0, "parallel.bucket_mb must be positive");
  ZT_CHECK(parallel.shard_group >= 0, "parallel.shard_group must be >= 0 (0: shard over all of dp)");
  ZT_CHECK(parallel.comm_timeout > 0, "parallel.comm_timeout must be positive (seconds)");
  ZT_CHECK(parallel.comm_backend == "auto" || parallel.comm_backend == "mpi" || parallel.comm_backend == "solo" ||
               parallel.comm_backend == "nccl",
           "parallel.comm_backend = '", parallel.comm_backend, "': choose auto, mpi, solo or nccl");
  ZT_CHECK(parallel.comm_backend != "nccl" || train.device == "cuda", "parallel.comm_backend = nccl moves GPU "
           "tensors: it needs train.device = cuda (use auto, mpi or solo on the CPU)");
  ZT_CHECK(checkpoint.every >= 0 && checkpoint.keep_last >= 0 && checkpoint.keep_every >= 0,
           "checkpoint.every, checkpoint.keep_last and checkpoint.keep_every must be >= 0 (0: off / keep all / none)");
}

Device local_gpu(int local_rank, int local_size, int gpus, const std::string& comm_backend) {
  if (local_size <= gpus || gpus == 0) return Device::cuda(local_rank);  // none: init_device says why
  ZT_CHECK(comm_backend == "mpi", local_size, " processes on this node share its ", gpus,
           " GPU(s), but NCCL needs one GPU per process: launch at most ", gpus, " processes per node, or set "
           "parallel.comm_backend = mpi (GPU tensors staged through host memory and MPI: slow, for testing "
           "layouts on few GPUs). If the launcher gives each process GPUs of its own (srun --gpus-per-task, "
           "CUDA_VISIBLE_DEVICES set per rank), set train.device = \"cuda:0\": each process then takes its own "
           "first GPU");
  return Device::cuda(local_rank % gpus);
}

std::string resolve_auto_device(const std::string& device) {
  if (device != "auto") return device;
  return ops::gpu_count() > 0 ? "cuda" : "cpu";
}

Device Config::device(bool multi_process) const {
  if (!gpu_by_local_rank() || !multi_process) return parse_device(train.device);
  const comm::WorldInfo w = comm::world_info();
  return local_gpu(w.local_rank, w.local_size, ops::gpu_count(), parallel.comm_backend);
}

std::vector<data::BlendPart> Config::data_parts() const {
  if (data.blend.empty()) return {data::BlendPart{data.dir, 1.0}};
  const char* form = "write data.blend as \"DIR WEIGHT, DIR WEIGHT, ...\" (e.g. \"data/web 0.7, data/code 0.3\")";
  std::vector<data::BlendPart> parts;
  size_t begin = 0;
  while (begin <= data.blend.size()) {
    const size_t end = std::min(data.blend.find(',', begin), data.blend.size());
    std::string entry = data.blend.substr(begin, end - begin);
    const size_t first = entry.find_first_not_of(" \t"), last = entry.find_last_not_of(" \t");
    entry = first == std::string::npos ? "" : entry.substr(first, last - first + 1);
    const size_t n = parts.size() + 1;
    ZT_CHECK(!entry.empty(), "data.blend entry ", n, " is empty; ", form);
    const size_t space = entry.find_last_of(" \t");
    ZT_CHECK(space != std::string::npos, "data.blend entry ", n, " ('", entry, "') has no weight; ", form);
    const std::string weight = entry.substr(space + 1);
    std::string dir = entry.substr(0, space);
    dir.erase(dir.find_last_not_of(" \t") + 1);
    char* stop = nullptr;
    const double w = std::strtod(weight.c_str(), &stop);
    ZT_CHECK(stop != weight.c_str() && *stop == '\0' && std::isfinite(w) && w > 0, "data.blend entry ", n, " ('",
             entry, "'): the weight '", weight, "' is not a positive number; ", form);
    parts.push_back({dir, w});
    begin = end + 1;
  }
  return parts;
}

std::string Config::checkpoint_dir() const {
  return checkpoint.dir.empty() ? train.run_dir + "/checkpoints" : checkpoint.dir;
}

}  // namespace zt::train
