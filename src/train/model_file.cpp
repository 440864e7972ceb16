#include "train/model_file.h"

#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "ops/device.h"
#include "train/checkpointing.h"

namespace zt::train {

namespace fs = std::filesystem;

std::string save_model_file(const nn::Transformer& model, const Config& cfg, bool write) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  // Whole tensors (assembled from the tensor-parallel slices: a collective), on the host.
  for (const nn::ParamSet* s : model.param_sets())
    for (size_t i = 0; i < s->size(); ++i)
      tensors.emplace_back(s->spec(i).name, ops::to_device(model.global_param(s->spec(i).name), Device::cpu()));
  if (!write) return "";
  const std::string path = (fs::path(cfg.train.run_dir) / "model.safetensors").string();
  ckpt::write_safetensors(path, tensors, {{"format", "zettatron-model"}, {"arch", std::string(nn::arch_name(cfg.model.arch))}});
  return path;
}

namespace {

// Copies every parameter from `lookup` (by global name; nullopt: absent)
// into the model; one error listing every tensor missing or of another
// dtype or shape, naming `what` the weights came from and `config`.
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
      } else if (src->shape() != dst.shape() || src->dtype() != dst.dtype()) {
        mismatches += "\n  " + name + ": " + what + " has " + std::string(dtype_name(src->dtype())) +
                      src->shape().str() + ", the config needs " + std::string(dtype_name(dst.dtype())) +
                      dst.shape().str();
      } else {
        ops::copy(dst, *src);  // to the model's device
      }
    }
  ZT_CHECK(mismatches.empty(), what, " does not match ", config, ":", mismatches);
}

}  // namespace

LoadedModel load_model_file(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const fs::path cfg_path = dir / "config.toml", weights_path = dir / "model.safetensors";
  LoadedModel out;
  if (!fs::exists(weights_path) && (fs::exists(dir / "manifest.json") || fs::exists(dir / "latest") ||
                                    fs::exists(dir / "checkpoints" / "latest"))) {
    // A checkpoint, or a run that has checkpoints but no final weights (yet):
    // its f32 master weights and its own config.
    const ModelCheckpoint ck = read_model_checkpoint(run_dir);
    const std::map<std::string, Tensor> weights(ck.tensors.begin(), ck.tensors.end());
    out.config = ck.config;
    out.model = std::make_unique<nn::Transformer>(out.config.model, DType::f32);
    fill_weights(
        *out.model,
        [&](const std::string& name) -> std::optional<Tensor> {
          auto it = weights.find(name);
          return it == weights.end() ? std::nullopt : std::optional<Tensor>(it->second);
        },
        ck.dir, "the config saved with it");
    return out;
  }
  ZT_CHECK(fs::exists(cfg_path), "'", run_dir, "' has no config.toml: pass the run directory of a finished run");
  ZT_CHECK(fs::exists(weights_path), "'", run_dir,
           "' has no model.safetensors: the run did not finish (the trainer writes it at the end)");
  out.config = load_config(cfg_path.string());
  out.model = std::make_unique<nn::Transformer>(out.config.model, out.config.compute_dtype());
  const auto file = ckpt::SafetensorsFile::open(weights_path.string());
  fill_weights(
      *out.model,
      [&](const std::string& name) -> std::optional<Tensor> {
        return file.contains(name) ? std::optional<Tensor>(file.tensor(name)) : std::nullopt;
      },
      weights_path.string(), cfg_path.string());
  return out;
}

}  // namespace zt::train
