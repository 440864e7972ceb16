// `zettatron generate --checkpoint DIR [--prompt TEXT | --prompt-file PATH]`
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <span>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "train/config.h"
#include "train/data_source.h"
#include "train/generate.h"
#include "train/model_file.h"

namespace zt::cli {

namespace {

// Writes text to stdout as it comes, holding back a UTF-8 character whose
// bytes have not all come yet (a byte-level token may end inside one).
class Utf8Stream {
 public:
  void write(const std::string& bytes) {
    pending_ += bytes;
    const size_t n = complete_prefix();
    std::cout.write(pending_.data(), std::streamsize(n));
    std::cout.flush();
    pending_.erase(0, n);
  }
  // Writes what is held back.
  void finish() {
    std::cout << pending_;
    pending_.clear();
  }

 private:
  // The bytes of pending_ up to a last character that is incomplete (all of
  // them when it is complete, or not UTF-8 at all).
  size_t complete_prefix() const {
    const size_t n = pending_.size();
    size_t lead = n;
    while (lead > 0 && n - lead < 4 && (uint8_t(pending_[lead - 1]) & 0xC0) == 0x80) --lead;
    if (lead == 0) return n;
    const uint8_t b = uint8_t(pending_[lead - 1]);
    const size_t need = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
    return n - (lead - 1) < need ? lead - 1 : n;
  }

  std::string pending_;
};

}  // namespace

Command add_generate_command(CLI::App& app) {
  struct Opts {
    std::string checkpoint;
    std::string prompt;
    std::string prompt_file;
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
  auto* prompt_opt = c.app->add_option("--prompt", opts->prompt, "Prompt text (default: the end-of-text token)");
  c.app->add_option("--prompt-file", opts->prompt_file, "Read the prompt text from this file ('-': standard input)")
      ->excludes(prompt_opt);
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
    if (!opts->device.empty()) device = parse_device(train::resolve_auto_device(opts->device));
    if (!opts->prompt_file.empty()) {  // read before the model loads: a bad path fails at once
      std::ifstream file;
      if (opts->prompt_file != "-") {
        file.open(opts->prompt_file, std::ios::binary);
        ZT_CHECK(file.good(), "--prompt-file: cannot read '", opts->prompt_file, "' (", std::strerror(errno), ")");
      }
      std::istream& in = opts->prompt_file == "-" ? std::cin : file;
      opts->prompt.assign(std::istreambuf_iterator<char>(in), {});
      ZT_CHECK(!opts->prompt.empty(), "--prompt-file: '", opts->prompt_file,
               "' is empty; leave the option out to start from the end-of-text token");
    }
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
    // One sample drawn with the cache is written as its tokens come (the
    // prompt first); several are written when all are drawn. A sample's
    // end-of-text token is not written.
    const bool stream = opts->count == 1 && !opts->no_kv_cache;
    const int64_t stop = so.stop_token;
    auto sample_text = [&](std::vector<uint32_t> out) {
      if (opts->prompt.empty()) out.erase(out.begin());
      if (!out.empty() && stop >= 0 && out.back() == uint32_t(stop)) out.pop_back();
      return codec->decode(out);
    };
    Utf8Stream streamed;
    if (stream && !opts->prompt.empty()) streamed.write(codec->decode(prompt));
    const train::TokenFn on_token = [&](int64_t, uint32_t token) {
      if (int64_t(token) != stop) streamed.write(codec->decode(std::span<const uint32_t>(&token, 1)));
    };
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<uint32_t>> samples;
    if (opts->no_kv_cache) {
      for (int64_t i = 0; i < opts->count; ++i) {
        train::SamplingOptions one = so;
        one.seed = so.seed + uint64_t(i);
        samples.push_back(train::generate(train::window_last_logits(model), model.config(), prompt, one));
      }
    } else {  // all samples at once, one KV cache of count sequences
      samples = train::generate_samples(model, prompt, so, opts->count, stream ? on_token : train::TokenFn{});
    }
    int64_t generated = 0;
    for (const std::vector<uint32_t>& out : samples) {
      generated += int64_t(out.size() - prompt.size());
      if (stream)
        streamed.finish();
      else
        std::cout << sample_text(out);
      std::cout << "\n---" << std::endl;
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
