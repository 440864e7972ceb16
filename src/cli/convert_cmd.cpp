// `zettatron convert --from-hf DIR --out CKPT` and
// `zettatron convert --to-hf CKPT --out DIR [--dtype f32|bf16|f16] [--max-shard-size 5GB]`:
// Hugging Face safetensors directories (GPT-2, Llama 3) to and from
// Zettatron checkpoints.
#include <algorithm>
#include <cctype>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "train/checkpointing.h"
#include "train/config.h"
#include "train/hf_format.h"

namespace zt::cli {

namespace {

// "5GB", "500MB", "2GiB", "123456" -> bytes (decimal units as save_pretrained
// uses them; the binary ones too).
int64_t parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  ZT_CHECK(i > 0, "--max-shard-size '", s, "': expected a number with an optional unit (e.g. 5GB, 500MB, 2GiB)");
  const double v = std::stod(s.substr(0, i));
  std::string unit = s.substr(i);
  for (char& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else ZT_FAIL("--max-shard-size '", s, "': unknown unit '", s.substr(i), "' (use B, KB, MB, GB, KiB, MiB, GiB)");
  return int64_t(v * mult);
}

DType parse_export_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16") return DType::f16;
  ZT_FAIL("--dtype '", s, "': choose f32, bf16 or f16");
}

}  // namespace

Command add_convert_command(CLI::App& app) {
  struct Opts {
    std::string from_hf, to_hf, out, dtype, max_shard = "5GB";
  };
  auto opts = std::make_shared<Opts>();
  Command c;
  c.app = app.add_subcommand("convert", "Convert between Hugging Face safetensors (GPT-2, Llama 3) and checkpoints");
  auto* from = c.app->add_option("--from-hf", opts->from_hf, "Hugging Face model directory (config.json + safetensors)")
                   ->check(CLI::ExistingDirectory);
  auto* to = c.app->add_option("--to-hf", opts->to_hf,
                               "Checkpoint to export (a checkpoint directory, a checkpoints directory or a run "
                               "directory: its latest)");
  from->excludes(to);
  c.app->add_option("--out", opts->out, "Output directory (must not exist, or be empty for --to-hf)")->required();
  c.app->add_option("--dtype", opts->dtype,
                    "--to-hf: weight dtype f32|bf16|f16 (default: the imported model's, else f32)");
  c.app->add_option("--max-shard-size", opts->max_shard,
                    "--to-hf: largest safetensors file before sharding (default 5GB, as save_pretrained)");
  c.run = [opts] {
    ZT_CHECK(!opts->from_hf.empty() || !opts->to_hf.empty(), "convert: pass --from-hf DIR or --to-hf CKPT");
    if (!opts->from_hf.empty()) {
      train::HfModel hf = train::read_hf_model(opts->from_hf);
      train::Config cfg;
      cfg.model = hf.config;
      cfg.data.tokenizer = hf.config.arch == nn::Arch::llama3 ? "llama3" : "gpt2";  // for `generate`
      cfg.train.seq_len = std::min<int64_t>(cfg.train.seq_len, hf.config.max_seq_len);
      train::write_model_checkpoint(opts->out, cfg, hf.tensors,
                                    {{"source", "huggingface"}, {"hf_dir", opts->from_hf}, {"hf_layout", hf.layout}});
      std::cout << "wrote " << opts->out << ": " << hf.tensors.size() << " tensors, "
                << double(hf.config.total_params()) / 1e6 << "M parameters (" << nn::arch_name(hf.config.arch)
                << "); fine-tune with `zettatron train CONFIG --init-from " << opts->out
                << "` (the [model] section must match; the checkpoint's manifest.json holds it)" << std::endl;
      return 0;
    }
    const train::ModelCheckpoint ck = train::read_model_checkpoint(opts->to_hf);
    const std::vector<float> bias = train::saved_router_bias(ck.state);
    ZT_CHECK(std::all_of(bias.begin(), bias.end(), [](float b) { return b == 0.0f; }),
             "HF export: ", ck.dir, " routes with balancing biases (model.router_bias_update_rate), which "
             "MixtralForCausalLM does not have: its experts would be chosen differently; keep the model in "
             "Zettatron's checkpoint format");
    nlohmann::json layout;  // null: the default (save_pretrained) layout
    // A model imported from HF goes back in its original layout (files,
    // order, dtypes, config.json), unless a dtype is asked for explicitly.
    if (ck.state.contains("hf_layout") && opts->dtype.empty()) layout = ck.state["hf_layout"];
    train::HfExportOptions eo;
    eo.dtype = parse_export_dtype(opts->dtype.empty() ? "f32" : opts->dtype);
    eo.max_shard_bytes = parse_size(opts->max_shard);
    train::write_hf_model(opts->out, ck.config.model, ck.tensors, layout, eo);
    std::cout << "wrote " << opts->out << " (Hugging Face " << (ck.config.model.arch == nn::Arch::gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM")
              << ") from " << ck.dir << std::endl;
    return 0;
  };
  return c;
}

}  // namespace zt::cli
