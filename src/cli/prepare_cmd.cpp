// `zettatron prepare`: text files -> token shards + index.json (data/prepare.h).
//
// Options come from the command line and/or a TOML file (--config FILE, a
// [prepare] table with the same names: tokenizer, input, output,
// val_fraction, shard_tokens, doc_split, threads); the command line wins.
#include <cstdint>
#include <iostream>
#include <memory>
#include <toml++/toml.h>

#include "cli/commands.h"
#include "core/error.h"
#include "data/prepare.h"

namespace zt::cli {
namespace {

struct PrepareArgs {
  data::PrepareOptions opts;
  std::string doc_split = "auto";
  std::string config;
  bool quiet = false;
};

// Fills the options the command line did not give from the [prepare] table.
void apply_config(PrepareArgs& a, const CLI::App& app) {
  toml::table file;
  try {
    file = toml::parse_file(a.config);
  } catch (const toml::parse_error& e) {
    ZT_FAIL("config '", a.config, "' is not valid TOML: ", e.description(), " (line ", e.source().begin.line, ")");
  }
  const toml::table* t = file["prepare"].as_table();
  ZT_CHECK(t, "config '", a.config, "' has no [prepare] table");
  const auto given = [&](const char* flag) { return app.count(flag) > 0; };
  for (const auto& [key, node] : *t) {
    const std::string k(key.str());
    const auto bad = [&](const char* want) { ZT_FAIL("config '", a.config, "': prepare.", k, " must be ", want); };
    if (k == "tokenizer" || k == "output" || k == "doc_split") {
      const auto v = node.value<std::string>();
      if (!v) bad("a string");
      if (k == "tokenizer" && !given("--tokenizer")) a.opts.tokenizer = *v;
      if (k == "output" && !given("--output")) a.opts.output = *v;
      if (k == "doc_split" && !given("--doc-split")) a.doc_split = *v;
    } else if (k == "input") {
      std::vector<std::string> inputs;
      if (const auto s = node.value<std::string>()) {
        inputs.push_back(*s);
      } else if (const toml::array* arr = node.as_array()) {
        for (const auto& e : *arr) {
          const auto v = e.value<std::string>();
          if (!v) bad("a string or an array of strings");
          inputs.push_back(*v);
        }
      } else {
        bad("a string or an array of strings");
      }
      if (!given("--input")) a.opts.inputs = inputs;
    } else if (k == "val_fraction") {
      const auto v = node.value<double>();
      if (!v) bad("a number");
      if (!given("--val-fraction")) a.opts.val_fraction = *v;
    } else if (k == "shard_tokens" || k == "threads") {
      const auto v = node.value<int64_t>();
      if (!v || *v < 0) bad("a non-negative integer");
      if (k == "shard_tokens" && !given("--shard-tokens")) a.opts.shard_tokens = uint64_t(*v);
      if (k == "threads" && !given("--threads")) a.opts.threads = int(*v);
    } else {
      ZT_FAIL("config '", a.config, "': unknown key prepare.", k,
              " (known: tokenizer, input, output, val_fraction, shard_tokens, doc_split, threads)");
    }
  }
}

}  // namespace

Command add_prepare_command(CLI::App& app) {
  auto a = std::make_shared<PrepareArgs>();
  Command c;
  c.app = app.add_subcommand("prepare", "Tokenise text files into checksummed token shards for training");
  CLI::App& s = *c.app;
  s.add_option("--config", a->config, "TOML file with a [prepare] table of these options (the command line wins)");
  s.add_option("--tokenizer", a->opts.tokenizer,
               "gpt2, llama3, a folder with encoder.json + vocab.bpe, or a tiktoken rank file")
      ->capture_default_str();
  s.add_option("--input", a->opts.inputs, "Text files or folders (searched recursively); repeatable")
      ->expected(1, -1);
  s.add_option("--output", a->opts.output, "Dataset folder to create (written atomically)");
  s.add_option("--val-fraction", a->opts.val_fraction, "Fraction of documents for the validation split")
      ->capture_default_str();
  s.add_option("--shard-tokens", a->opts.shard_tokens, "Tokens per shard file")->capture_default_str();
  s.add_option("--doc-split", a->doc_split,
               "How files are cut into documents: auto (jsonl for *.jsonl, else whole file), file, "
               "percent (fortune files: '%' lines), blank (blank lines), line, jsonl ({\"text\": ...} per line)")
      ->capture_default_str();
  s.add_option("--threads", a->opts.threads, "Tokeniser threads (0 = all cores)")->capture_default_str();
  s.add_flag("--force", a->opts.force, "Replace OUTPUT if it exists");
  s.add_flag("--quiet", a->quiet, "No progress bar or summary");
  c.run = [a, &s] {
    if (!a->config.empty()) apply_config(*a, s);
    a->opts.doc_split = data::parse_doc_split(a->doc_split);
    a->opts.progress = !a->quiet;
    data::prepare(a->opts, a->quiet ? nullptr : &std::cerr);
    return 0;
  };
  return c;
}

}  // namespace zt::cli
