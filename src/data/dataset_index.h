// index.json: what `zettatron prepare` wrote into a dataset folder.
//
//   {
//     "format": "zettatron-token-shards", "version": 1,
//     "tokenizer": {"name": "gpt2", "vocab_size": 50257, "eot_token": 50256,
//                   "fingerprint": "<16 hex>"},
//     "token_dtype": "u16",
//     "splits": {
//       "train": {"tokens": N, "documents": D,
//                 "shards": [{"file": "train-000000.bin", "tokens": n,
//                             "documents": d, "checksum": "<16 hex>"}, ...]},
//       "val":   {...}
//     },
//     "source": {"inputs": [...], "files": F, "bytes": B, "doc_split": "percent",
//                "val_fraction": 0.05, "skipped": {...}}
//   }
//
// Written last, inside a temporary folder that is renamed into place, so a
// folder with an index.json is complete. No timestamps: the same inputs and
// options give byte-identical output.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zt::data {

enum class Split { train, val };
const char* split_name(Split s);

struct ShardInfo {
  std::string file;  // name inside the dataset folder
  uint64_t tokens = 0;
  uint64_t documents = 0;
  uint64_t checksum = 0;
};

struct SplitInfo {
  std::vector<ShardInfo> shards;
  uint64_t tokens = 0;
  uint64_t documents = 0;
};

struct DatasetIndex {
  static constexpr int kVersion = 1;
  std::string tokenizer_name;
  std::string tokenizer_fingerprint;
  uint64_t vocab_size = 0;
  uint32_t eot_token = 0;
  uint32_t token_bytes = 2;
  SplitInfo train, val;
  nlohmann::json source = nlohmann::json::object();

  const SplitInfo& split(Split s) const { return s == Split::train ? train : val; }
  SplitInfo& split(Split s) { return s == Split::train ? train : val; }

  nlohmann::json to_json() const;
  // Throws zt::Error naming `where` and the field that is missing or wrong.
  static DatasetIndex from_json(const nlohmann::json& j, const std::string& where);
  // Reads DIR/index.json.
  static DatasetIndex load(const std::string& dir);
  // 16 hex digits over the tokenizer and every shard's name, size and checksum.
  std::string fingerprint() const;
};

}  // namespace zt::data
