#include "train/model_file.h"

#include <cstring>
#include <filesystem>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "ops/device.h"
#include "train/checkpointing.h"

namespace zt::train {

namespace fs = std::filesystem;

std::string save_model_file(const nn::Transformer& model, const Config& cfg) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const nn::ParamSet* s : model.param_sets())
    for (size_t i = 0; i < s->size(); ++i) tensors.emplace_back(s->spec(i).name, ops::to_device(s->param(i), Device::cpu()));  // host copy of a GPU model
  const std::string path = (fs::path(cfg.train.run_dir) / "model.safetensors").string();
  ckpt::write_safetensors(path, tensors, {{"format", "zettatron-model"}, {"arch", std::string(nn::arch_name(cfg.model.arch))}});
  return path;
}

LoadedModel load_model_file(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const fs::path cfg_path = dir / "config.toml", weights_path = dir / "model.safetensors";
  if (!fs::exists(weights_path) && (fs::exists(dir / "manifest.json") || fs::exists(dir / "latest") ||
                                    fs::exists(dir / "checkpoints" / "latest"))) {
    // A checkpoint, or a run that has checkpoints but no final weights (yet).
    ModelCheckpoint ck = read_model_checkpoint(run_dir);
    LoadedModel out;
    out.config = ck.config;
    out.model = std::make_unique<nn::Transformer>(out.config.model, DType::f32);
    std::string mismatches;
    for (const auto& [name, t] : ck.tensors) {
      const Tensor dst = out.model->param(name);
      if (dst.shape() != t.shape())
        mismatches += "\n  " + name + ": checkpoint " + t.shape().str() + ", config " + dst.shape().str();
      else
        ops::copy(dst, t);
    }
    ZT_CHECK(mismatches.empty(), ck.dir, " does not match its own config:", mismatches);
    return out;
  }
  ZT_CHECK(fs::exists(cfg_path), "'", run_dir, "' has no config.toml: pass the run directory of a finished run");
  ZT_CHECK(fs::exists(weights_path), "'", run_dir,
           "' has no model.safetensors: the run did not finish (the trainer writes it at the end)");
  LoadedModel out;
  out.config = load_config(cfg_path.string());
  out.model = std::make_unique<nn::Transformer>(out.config.model, out.config.compute_dtype());
  auto file = ckpt::SafetensorsFile::open(weights_path.string());
  std::string mismatches;
  for (nn::ParamSet* s : out.model->param_sets())
    for (size_t i = 0; i < s->size(); ++i) {
      const std::string& name = s->spec(i).name;
      const Tensor dst = s->param(i);
      if (!file.contains(name)) {
        mismatches += "\n  " + name + ": missing";
        continue;
      }
      const Tensor src = file.tensor(name);
      if (src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
        mismatches += "\n  " + name + ": file has " + std::string(dtype_name(src.dtype())) + src.shape().str() +
                      ", config needs " + std::string(dtype_name(dst.dtype())) + dst.shape().str();
        continue;
      }
      ops::copy(dst, src);  // to the model's device
    }
  ZT_CHECK(mismatches.empty(), weights_path.string(), " does not match ", cfg_path.string(), ":", mismatches);
  return out;
}

}  // namespace zt::train
