// `zettatron generate --checkpoint DIR --prompt TEXT`
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "ops/device.h"
#include "train/data_source.h"
#include "train/generate.h"
#include "train/model_file.h"

namespace zt::cli {

Command add_generate_command(CLI::App& app) {
  struct Opts {
    std::string checkpoint;
    std::string prompt;
    std::string tokenizer;
    std::string device;
    int64_t tokens = 64;
    double temperature = 0.8;
    int64_t top_k = 40;
    double top_p = 1.0;
    uint64_t seed = 0;
    int64_t count = 1;
    bool no_kv_cache = false;
    bool ignore_eot = false;
  };
  auto opts = std::make_shared<Opts>();
  Command c;
  c.app = app.add_subcommand("generate", "Sample text from a trained model");
  c.app->add_option("--checkpoint", opts->checkpoint,
                    "Run directory (config.toml + model.safetensors, or its latest checkpoint) or a checkpoint")
      ->required();
  c.app->add_option("--tokenizer", opts->tokenizer, "gpt2, llama3 or a tokenizer file (default: the run's)");
  c.app->add_option("--device", opts->device,
                    "cpu, cuda, cuda:N or auto (a GPU if there is one; default: the run's train.device where this machine has it, else cpu)");
  c.app->add_option("--prompt", opts->prompt, "Prompt text (default: the end-of-text token)");
  c.app->add_option("--tokens", opts->tokens, "Tokens to generate")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  c.app->add_option("--temperature", opts->temperature, "Softmax temperature (0: the most likely token, greedy)")
      ->check(CLI::NonNegativeNumber);
  c.app->add_option("--top-k", opts->top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  c.app->add_option("--top-p", opts->top_p,
                    "Of those, the most likely whose probabilities sum to this (nucleus sampling; 1: all)")
      ->check(CLI::Range(0.0, 1.0));
  c.app->add_option("--seed", opts->seed, "Sampling seed");
  c.app->add_option("--count", opts->count, "Number of samples (drawn together: seeds seed, seed + 1, ...)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  c.app->add_flag("--ignore-eot", opts->ignore_eot, "Keep sampling past the end-of-text token (all --tokens tokens)");
  c.app->add_flag("--no-kv-cache", opts->no_kv_cache,
                  "Run each step's whole window again instead of keeping keys and values (slower; for comparison)");
  c.run = [opts] {
    std::optional<Device> device;
    if (opts->device == "auto")
      device = ops::gpu_count() > 0 ? Device::cuda(0) : Device::cpu();
    else if (!opts->device.empty())
      device = parse_device(opts->device);
    train::LoadedModel loaded = train::load_model_file(opts->checkpoint, device);
    // stderr: stdout keeps only the samples.
    std::cerr << "weights: " << loaded.source << " on " << loaded.model->device().str() << " in "
              << dtype_name(loaded.model->compute_dtype()) << std::endl;
    std::unique_ptr<train::TextCodec> codec = train::open_codec(opts->tokenizer.empty() ? loaded.config.data.tokenizer : opts->tokenizer);
    std::vector<uint32_t> prompt =
        opts->prompt.empty() ? std::vector<uint32_t>{codec->eot_token} : codec->encode(opts->prompt);
    nn::Transformer& model = *loaded.model;
    train::SamplingOptions so;
    so.max_new_tokens = opts->tokens;
    so.temperature = opts->temperature;
    so.top_k = opts->top_k;
    so.top_p = opts->top_p;
    so.seed = opts->seed;  // sample i: seed + i
    so.stop_token = opts->ignore_eot ? -1 : int64_t(codec->eot_token);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<uint32_t>> samples;
    if (opts->no_kv_cache) {
      for (int64_t i = 0; i < opts->count; ++i) {
        train::SamplingOptions one = so;
        one.seed = so.seed + uint64_t(i);
        samples.push_back(train::generate(train::window_last_logits(model), model.config(), prompt, one));
      }
    } else {  // all samples at once, one KV cache of count sequences
      samples = train::generate_samples(model, prompt, so, opts->count);
    }
    int64_t generated = 0;
    for (std::vector<uint32_t>& out : samples) {
      generated += int64_t(out.size() - prompt.size());
      if (opts->prompt.empty()) out.erase(out.begin());
      std::cout << codec->decode(out) << "\n---" << std::endl;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // stderr, as the weights line: stdout keeps only the samples.
    std::fprintf(stderr, "generated %lld tokens in %.3f s (%.1f tokens/s, %s; prompt %zu tokens)\n",
                 static_cast<long long>(generated), seconds, double(generated) / seconds,
                 opts->no_kv_cache ? "each window run again" : "KV cache", prompt.size());
    return 0;
  };
  return c;
}

}  // namespace zt::cli
