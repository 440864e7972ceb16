// Token shards: the files `zettatron prepare` writes and the loader maps.
//
// A shard is a 64-byte header followed by the tokens, little-endian:
//
//   offset  size  field
//        0     8  magic "ZTTOKENS"
//        8     4  u32 format version (kShardVersion)
//       12     4  u32 bytes per token: 2 (u16, vocabularies up to 65536) or 4 (u32)
//       16     8  u64 token count
//       24     8  u64 checksum of the token bytes (Checksum64, core/hash.h)
//       32     4  u32 vocabulary size of the tokenizer that wrote it
//       36     4  reserved, 0
//       40     8  u64 documents: end-of-text tokens in this shard
//       48     8  reserved, 0
//       56     8  u64 checksum of header bytes [0, 56)
//       64        token_count tokens
//
// The header is written last (a placeholder first), so a shard that was cut
// short never has a valid header; prepare also writes into a temporary folder
// that is renamed into place only when everything is complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/hash.h"

namespace zt::data {

inline constexpr char kShardMagic[8] = {'Z', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;
  uint64_t token_count = 0;
  uint64_t checksum = 0;
  uint32_t vocab_size = 0;
  uint64_t documents = 0;
};

// The 64 header bytes of `h` (with its header checksum).
std::vector<unsigned char> encode_shard_header(const ShardHeader& h);

// Bytes per token for a vocabulary: 2 if every id fits in u16, else 4.
inline uint32_t token_bytes_for_vocab(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

class ShardWriter {
 public:
  // Creates (truncates) `path`. Throws zt::Error if it cannot.
  ShardWriter(std::string path, uint32_t token_bytes, uint32_t vocab_size);
  ~ShardWriter();  // closes an unfinished file (left without a valid header)
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends tokens (narrowed to token_bytes; ids are not range-checked here).
  void append(const uint32_t* ids, size_t n);
  void add_documents(uint64_t n) { header_.documents += n; }
  uint64_t tokens() const { return header_.token_count; }
  // Writes the header, flushes and fsyncs, closes. Returns the final header.
  ShardHeader finish();

 private:
  void flush_buffer();
  std::string path_;
  std::FILE* f_ = nullptr;
  ShardHeader header_;
  std::vector<unsigned char> buf_;
  Checksum64 sum_;
};

// A validated, read-only memory map of one shard.
class ShardReader {
 public:
  // Checks, with messages naming the file: size >= header, magic, version,
  // header checksum, token width, file size == header + tokens, and the
  // vocabulary size recorded against `vocab_size`. With `verify`, also reads
  // every token: the checksum must match and every id must be < vocab_size.
  ShardReader(const std::string& path, uint32_t vocab_size, bool verify);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  uint64_t tokens() const { return header_.token_count; }
  // Copies tokens [first, first + count) as int32.
  void read(uint64_t first, uint64_t count, int32_t* out) const;

 private:
  std::string path_;
  ShardHeader header_;
  struct Mapping {  // unmapped even when the constructor throws
    void* addr = nullptr;
    size_t bytes = 0;
    ~Mapping();
  } map_;
  const unsigned char* tokens_ = nullptr;
};

}  // namespace zt::data
