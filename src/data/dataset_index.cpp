#include "data/dataset_index.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/hash.h"

namespace zt::data {

const char* split_name(Split s) { return s == Split::train ? "train" : "val"; }

namespace {

nlohmann::json split_json(const SplitInfo& s) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardInfo& sh : s.shards)
    shards.push_back({{"file", sh.file}, {"tokens", sh.tokens}, {"documents", sh.documents},
                      {"checksum", hex64(sh.checksum)}});
  return {{"tokens", s.tokens}, {"documents", s.documents}, {"shards", shards}};
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  ZT_CHECK(j.is_object() && j.contains(key), where, ": missing field \"", key, "\"");
  return j.at(key);
}

uint64_t u64_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = field(j, key, where);
  ZT_CHECK(v.is_number_unsigned(), where, ": field \"", key, "\" must be a non-negative integer");
  return v.get<uint64_t>();
}

std::string str_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = field(j, key, where);
  ZT_CHECK(v.is_string(), where, ": field \"", key, "\" must be a string");
  return v.get<std::string>();
}

SplitInfo split_from_json(const nlohmann::json& j, const std::string& where) {
  SplitInfo s;
  s.tokens = u64_field(j, "tokens", where);
  s.documents = u64_field(j, "documents", where);
  const auto& shards = field(j, "shards", where);
  ZT_CHECK(shards.is_array(), where, ": \"shards\" must be an array");
  uint64_t tokens = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string w = where + ".shards[" + std::to_string(i) + "]";
    ShardInfo sh;
    sh.file = str_field(shards[i], "file", w);
    ZT_CHECK(!sh.file.empty() && sh.file.find('/') == std::string::npos && sh.file[0] != '.', w,
             ": shard file name \"", sh.file, "\" must be a plain file name inside the dataset folder");
    sh.tokens = u64_field(shards[i], "tokens", w);
    sh.documents = u64_field(shards[i], "documents", w);
    sh.checksum = parse_hex64(str_field(shards[i], "checksum", w), w);
    tokens += sh.tokens;
    s.shards.push_back(std::move(sh));
  }
  ZT_CHECK(tokens == s.tokens, where, ": the shards hold ", tokens, " tokens but \"tokens\" says ", s.tokens);
  return s;
}

}  // namespace

nlohmann::json DatasetIndex::to_json() const {
  nlohmann::json j;
  j["format"] = "zettatron-token-shards";
  j["version"] = kVersion;
  j["tokenizer"] = {{"name", tokenizer_name},
                    {"vocab_size", vocab_size},
                    {"eot_token", eot_token},
                    {"fingerprint", tokenizer_fingerprint}};
  j["token_dtype"] = token_bytes == 2 ? "u16" : "u32";
  j["splits"] = {{"train", split_json(train)}, {"val", split_json(val)}};
  j["source"] = source;
  return j;
}

DatasetIndex DatasetIndex::from_json(const nlohmann::json& j, const std::string& where) {
  ZT_CHECK(j.is_object(), where, " must be a JSON object");
  ZT_CHECK(j.value("format", "") == "zettatron-token-shards", where,
           " is not a Zettatron dataset index (\"format\" must be \"zettatron-token-shards\")");
  const uint64_t version = u64_field(j, "version", where);
  ZT_CHECK(version == uint64_t(kVersion), where, " has version ", version, "; this build reads version ", kVersion,
           " (re-run `zettatron prepare`)");
  DatasetIndex d;
  const auto& t = field(j, "tokenizer", where);
  const std::string tw = where + ".tokenizer";
  d.tokenizer_name = str_field(t, "name", tw);
  d.tokenizer_fingerprint = str_field(t, "fingerprint", tw);
  d.vocab_size = u64_field(t, "vocab_size", tw);
  ZT_CHECK(d.vocab_size > 0 && d.vocab_size <= (uint64_t(1) << 31), tw, ": vocab_size ", d.vocab_size,
           " is out of range");
  const uint64_t eot = u64_field(t, "eot_token", tw);
  ZT_CHECK(eot < d.vocab_size, tw, ": eot_token ", eot, " is not below vocab_size ", d.vocab_size);
  d.eot_token = uint32_t(eot);
  const std::string dtype = str_field(j, "token_dtype", where);
  ZT_CHECK(dtype == "u16" || dtype == "u32", where, ": token_dtype must be \"u16\" or \"u32\", not \"", dtype, "\"");
  d.token_bytes = dtype == "u16" ? 2 : 4;
  ZT_CHECK(d.token_bytes == 4 || d.vocab_size <= 65536, where, ": token_dtype u16 cannot hold a vocabulary of ",
           d.vocab_size);
  const auto& splits = field(j, "splits", where);
  d.train = split_from_json(field(splits, "train", where + ".splits"), where + ".splits.train");
  d.val = split_from_json(field(splits, "val", where + ".splits"), where + ".splits.val");
  if (j.contains("source")) d.source = j.at("source");
  return d;
}

DatasetIndex DatasetIndex::load(const std::string& dir) {
  ZT_CHECK(std::filesystem::is_directory(dir), "dataset folder '", dir,
           "' does not exist (create it with `zettatron prepare --output ", dir, " ...`)");
  const std::string path = dir + "/index.json";
  std::ifstream f(path);
  ZT_CHECK(f.good(), "dataset folder '", dir, "' has no index.json: not a prepared dataset, or prepare did not finish");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    ZT_FAIL("'", path, "' is not valid JSON: ", e.what());
  }
  return from_json(j, "'" + path + "'");
}

std::string DatasetIndex::fingerprint() const {
  uint64_t h = hash_bytes(tokenizer_fingerprint.data(), tokenizer_fingerprint.size(), vocab_size);
  for (const SplitInfo* s : {&train, &val}) {
    h = mix64(h ^ s->tokens);
    for (const ShardInfo& sh : s->shards)
      h = mix64(h ^ hash_bytes(sh.file.data(), sh.file.size(), sh.tokens) ^ sh.checksum);
  }
  return hex64(h);
}

}  // namespace zt::data
