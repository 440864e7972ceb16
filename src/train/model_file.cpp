#include "train/model_file.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "ckpt/checkpoint_writer.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "train/checkpointing.h"

namespace zt::train {

namespace fs = std::filesystem;

// model.safetensors' name for the routing biases (n_layer, E) f32.
constexpr const char* kRouterBiasTensor = "router_bias";

std::string save_model_file(const nn::Transformer& model, const Config& cfg, bool write) {
  return save_model_file(std::vector<const nn::Transformer*>{&model}, nullptr, cfg, write);
}

namespace {

// Packs (name, tensor) pairs into one i64 header (count, then per
// tensor: name length, ndim, dims), the names' bytes and the data, for one
// point-to-point transfer each.
struct Packed {
  Tensor header, names, data;
};

Packed pack(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<int64_t> h{int64_t(tensors.size())};
  std::string names;
  int64_t elems = 0;
  for (const auto& [name, t] : tensors) {
    h.push_back(int64_t(name.size()));
    h.push_back(t.ndim());
    for (int d = 0; d < t.ndim(); ++d) h.push_back(t.size(d));
    names += name;
    elems += t.numel();
  }
  Packed p{Tensor::empty(Shape{int64_t(h.size())}, DType::i64),
           Tensor::empty(Shape{std::max<int64_t>(1, (int64_t(names.size()) + 3) / 4)}, DType::i32),
           Tensor::empty(Shape{std::max<int64_t>(1, elems)}, DType::f32)};
  std::memcpy(p.header.data_ptr(), h.data(), h.size() * 8);
  std::memset(p.names.data_ptr(), 0, p.names.nbytes());
  std::memcpy(p.names.data_ptr(), names.data(), names.size());
  int64_t at = 0;
  for (const auto& [name, t] : tensors) {
    ops::cast(p.data.flat_view(at, t.shape()), t);  // f32 on the wire
    at += t.numel();
  }
  return p;
}

}  // namespace

std::string save_model_file(const std::vector<const nn::Transformer*>& chunks, comm::ProcessGroup* pp,
                            const Config& cfg, bool write, const std::vector<float>& router_bias, int64_t step) {
  // This rank's whole tensors (assembled from the tensor-parallel slices: a
  // collective over tp), on the host, f32 for the transfer; the head
  // stage's copy of a tied embedding is the embedding stage's.
  std::vector<std::pair<std::string, Tensor>> tensors;
  DType dtype = DType::f32;
  for (const nn::Transformer* model : chunks) {
    dtype = model->compute_dtype();
    for (const nn::ParamSet* s : model->param_sets())
      for (size_t i = 0; i < s->size(); ++i) {
        const std::string& name = s->spec(i).name;
        // (The same on every tp rank, so skipping keeps the tp collectives paired.)
        if (!model->part().embedding && name == "embed.wte") continue;
        tensors.emplace_back(name, ops::to_device(model->global_param(name), Device::cpu()));
      }
  }
  if (pp && pp->size() > 1) {
    if (pp->rank() != 0) {
      const Packed p = pack(tensors);
      Tensor sizes = Tensor::empty(Shape{3}, DType::i64);
      sizes.data<int64_t>()[0] = p.header.numel();
      sizes.data<int64_t>()[1] = p.names.numel();
      sizes.data<int64_t>()[2] = p.data.numel();
      for (const Tensor* t : {static_cast<const Tensor*>(&sizes), &p.header, &p.names, &p.data}) pp->send(*t, 0, 7)->wait();
      return "";
    }
    for (int r = 1; r < pp->size(); ++r) {
      Tensor sizes = Tensor::empty(Shape{3}, DType::i64);
      pp->recv(sizes, r, 7)->wait();
      const int64_t* n = sizes.data<int64_t>();
      Packed p{Tensor::empty(Shape{n[0]}, DType::i64), Tensor::empty(Shape{n[1]}, DType::i32),
               Tensor::empty(Shape{n[2]}, DType::f32)};
      for (const Tensor* t : {&p.header, &p.names, &p.data}) pp->recv(*t, r, 7)->wait();
      const int64_t* h = p.header.data<int64_t>();
      const char* names = static_cast<const char*>(p.names.data_ptr());
      int64_t at = 0, name_at = 0, k = 1;
      for (int64_t i = 0; i < h[0]; ++i) {
        const int64_t len = h[k++], nd = h[k++];
        std::vector<int64_t> dims(h + k, h + k + nd);
        k += nd;
        // f32 on the wire; saved in the compute dtype, as a single-process run saves them.
        Tensor t = Tensor::empty(Shape(dims.begin(), dims.end()), dtype);
        ops::cast(t, p.data.flat_view(at, t.shape()));
        at += t.numel();
        tensors.emplace_back(std::string(names + name_at, size_t(len)), t);
        name_at += len;
      }
    }
  }
  if (!write) return "";
  if (!router_bias.empty()) {  // every rank holds all of them (the trainer's progress)
    Tensor b = Tensor::empty(Shape{cfg.model.n_layer, cfg.model.n_expert}, DType::f32);
    ZT_CHECK(int64_t(router_bias.size()) == b.numel(), "save_model_file: ", router_bias.size(),
             " routing biases for ", b.numel(), " experts of the model's blocks");
    std::copy(router_bias.begin(), router_bias.end(), b.data<float>());
    tensors.emplace_back(kRouterBiasTensor, b);
  }
  const std::string path = (fs::path(cfg.train.run_dir) / "model.safetensors").string();
  // The run's config without its directory: the same training in another
  // directory writes the same bytes.
  Config described = cfg;
  described.train.run_dir = "";
  std::map<std::string, std::string> metadata{{"format", "zettatron-model"},
                                              {"arch", std::string(nn::arch_name(cfg.model.arch))},
                                              {"config", to_toml(described)}};
  if (step >= 0) metadata["step"] = std::to_string(step);
  ckpt::write_safetensors(path, tensors, metadata);
  return path;
}

namespace {

// Copies every parameter from `lookup` (by global name; nullopt: absent)
// into the model, cast to the model's dtype; one error listing every tensor
// missing or of another shape, naming `what` the weights came from and
// `config`.
void fill_weights(nn::Transformer& model, const std::function<std::optional<Tensor>(const std::string&)>& lookup,
                  const std::string& what, const std::string& config) {
  std::string mismatches;
  for (nn::ParamSet* s : model.param_sets())
    for (size_t i = 0; i < s->size(); ++i) {
      const std::string& name = s->spec(i).name;
      const Tensor dst = s->param(i);
      const std::optional<Tensor> src = lookup(name);
      if (!src) {
        mismatches += "\n  " + name + ": missing";
      } else if (src->shape() != dst.shape()) {
        mismatches += "\n  " + name + ": " + what + " has " + std::string(dtype_name(src->dtype())) +
                      src->shape().str() + ", the config needs " + std::string(dtype_name(dst.dtype())) +
                      dst.shape().str();
      } else if (src->dtype() != dst.dtype()) {
        if (dst.device().is_cpu()) {
          ops::cast(dst, *src);
        } else {  // cast on the host, where the file's tensor is, then copied
          const Tensor cast = Tensor::empty(dst.shape(), dst.dtype());
          ops::cast(cast, *src);
          ops::copy(dst, cast);
        }
      } else {
        ops::copy(dst, *src);  // to the model's device
      }
    }
  ZT_CHECK(mismatches.empty(), what, " does not match ", config, ":", mismatches);
}

}  // namespace

namespace {

// Where a loaded model runs: `asked`, else the run's device where this
// machine has it (a bare "cuda": the first GPU), else the CPU.
Device inference_device(const Config& cfg, std::optional<Device> asked) {
  if (asked) return *asked;
  const Device run = parse_device(cfg.train.device);
  return run.is_cuda() && run.index < ops::gpu_count() ? run : Device::cpu();
}

// An inference model of `cfg` on `device`, in `dtype` (f32 for f16 on a
// CPU, which has no f16 kernels): no gradient buffers (a model allocates
// and zeroes them when it is built).
std::unique_ptr<nn::Transformer> inference_model(const nn::ModelConfig& cfg, DType dtype, Device device) {
  if (dtype == DType::f16 && device.is_cpu()) dtype = DType::f32;
  auto model = std::make_unique<nn::Transformer>(cfg, dtype, device);
  for (nn::ParamSet* s : model->param_sets()) s->release_grads();
  return model;
}

// The f32 master weights of a checkpoint and its own config.
LoadedModel load_checkpoint_weights(const std::string& path, std::optional<Device> device) {
  const ModelCheckpoint ck = read_model_checkpoint(path);
  const std::map<std::string, Tensor> weights(ck.tensors.begin(), ck.tensors.end());
  LoadedModel out;
  out.config = ck.config;
  out.model = inference_model(out.config.model, DType::f32, inference_device(out.config, device));
  fill_weights(
      *out.model,
      [&](const std::string& name) -> std::optional<Tensor> {
        auto it = weights.find(name);
        return it == weights.end() ? std::nullopt : std::optional<Tensor>(it->second);
      },
      ck.dir, "the config saved with it");
  out.model->set_router_bias(saved_router_bias(ck.state));
  out.source = "checkpoint " + ck.dir;
  return out;
}

}  // namespace

LoadedModel load_model_file(const std::string& run_dir, std::optional<Device> device) {
  const fs::path dir(run_dir);
  const fs::path cfg_path = dir / "config.toml", weights_path = dir / "model.safetensors";
  if (!fs::exists(weights_path) && (fs::exists(dir / "manifest.json") || fs::exists(dir / "latest") ||
                                    fs::exists(dir / "checkpoints" / "latest")))
    // A checkpoint, or a run that has checkpoints but no final weights (yet).
    return load_checkpoint_weights(run_dir, device);
  ZT_CHECK(fs::exists(weights_path), "'", run_dir,
           "' has no model.safetensors: the run did not finish (the trainer writes it at the end)");
  const auto file = ckpt::SafetensorsFile::open(weights_path.string());
  const std::map<std::string, std::string>& meta = file.metadata();
  // A file that records its step (since 2026-12-07) yields to a later
  // checkpoint of the same directory: a resumed run that stopped before its
  // end left its newest weights there.
  const auto step_it = meta.find("step");
  int64_t step = -1;
  if (step_it != meta.end()) {
    const std::string& text = step_it->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
    ZT_CHECK(ec == std::errc() && end == text.data() + text.size() && step >= 0, weights_path.string(),
             ": its metadata's step '", text, "' is not a step count; remove the \"step\" entry or rewrite the file");
  }
  // The checkpoint's step from its name: opening it checks every file's checksum.
  const int64_t checkpoint_step =
      step >= 0 ? ckpt::latest_checkpoint_step((dir / "checkpoints").string()).value_or(-1) : -1;
  if (checkpoint_step > step) {
    LoadedModel newer = load_checkpoint_weights((dir / "checkpoints").string(), device);
    newer.source += " (step " + std::to_string(checkpoint_step) + ", newer than " + weights_path.string() +
                    " at step " + std::to_string(step) + ")";
    return newer;
  }
  // The file's own config (since 2026-12-07), else the run's config.toml:
  // a later run in the same directory rewrites config.toml when it starts.
  LoadedModel out;
  const auto cfg_it = meta.find("config");
  std::string config_origin = weights_path.string() + " (its config)";
  if (cfg_it != meta.end()) {
    out.config = parse_saved_config(cfg_it->second, config_origin);
  } else {
    ZT_CHECK(fs::exists(cfg_path), "'", run_dir, "' has no config.toml: pass the run directory of a finished run");
    out.config = load_config(cfg_path.string());
    config_origin = cfg_path.string();
  }
  out.model = inference_model(out.config.model, out.config.compute_dtype(), inference_device(out.config, device));
  out.source = weights_path.string() + (step >= 0 ? " (step " + std::to_string(step) + ")" : "");
  fill_weights(
      *out.model,
      [&](const std::string& name) -> std::optional<Tensor> {
        return file.contains(name) ? std::optional<Tensor>(file.tensor(name)) : std::nullopt;
      },
      weights_path.string(), config_origin);
  if (file.contains(kRouterBiasTensor)) {
    const Tensor b = file.tensor(kRouterBiasTensor);
    ZT_CHECK(b.dtype() == DType::f32 && b.shape() == Shape({out.config.model.n_layer, out.config.model.n_expert}),
             weights_path.string(), ": router_bias is ", dtype_name(b.dtype()), b.shape().str(), ", but ",
             config_origin, " needs f32 (n_layer, n_expert) = (", out.config.model.n_layer, ", ",
             out.config.model.n_expert, ")");
    out.model->set_router_bias(std::vector<float>(b.data<float>(), b.data<float>() + b.numel()));
  }
  return out;
}

}  // namespace zt::train
