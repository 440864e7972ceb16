// `zettatron prepare`: text files -> token shards + index.json (data/prepare.h).
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "data/prepare.h"

namespace zt::cli {

Command add_prepare_command(CLI::App& app) {
  auto opts = std::make_shared<data::PrepareOptions>();
  auto doc_split = std::make_shared<std::string>("auto");
  auto quiet = std::make_shared<bool>(false);
  Command c;
  c.app = app.add_subcommand("prepare", "Tokenise text files into checksummed token shards for training");
  c.app->add_option("--tokenizer", opts->tokenizer,
                    "gpt2, llama3, a folder with encoder.json + vocab.bpe, or a tiktoken rank file")
      ->capture_default_str();
  c.app->add_option("--input", opts->inputs, "Text files or folders (searched recursively); repeatable")
      ->required()
      ->expected(1, -1);
  c.app->add_option("--output", opts->output, "Dataset folder to create (written atomically)")->required();
  c.app->add_option("--val-fraction", opts->val_fraction, "Fraction of documents for the validation split")
      ->capture_default_str();
  c.app->add_option("--shard-tokens", opts->shard_tokens, "Tokens per shard file")->capture_default_str();
  c.app->add_option("--doc-split", *doc_split,
                    "How files are cut into documents: auto (jsonl for *.jsonl, else whole file), file, "
                    "percent (fortune files: '%' lines), blank (blank lines), line, jsonl ({\"text\": ...} per line)")
      ->capture_default_str();
  c.app->add_option("--threads", opts->threads, "Tokeniser threads (0 = all cores)")->capture_default_str();
  c.app->add_flag("--force", opts->force, "Replace OUTPUT if it exists");
  c.app->add_flag("--quiet", *quiet, "No progress bar or summary");
  c.run = [opts, doc_split, quiet] {
    opts->doc_split = data::parse_doc_split(*doc_split);
    opts->progress = !*quiet;
    data::prepare(*opts, *quiet ? nullptr : &std::cerr);
    return 0;
  };
  return c;
}

}  // namespace zt::cli
