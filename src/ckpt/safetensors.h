// safetensors reader and writer.
//
// File format (https://github.com/huggingface/safetensors):
//   bytes [0, 8)        N, little-endian u64: the header length
//   bytes [8, 8+N)      UTF-8 JSON object, optionally padded with spaces:
//                         {"__metadata__": {"key": "value", ...},       (optional)
//                          "<name>": {"dtype": "F32", "shape": [2, 3],
//                                     "data_offsets": [begin, end]}, ...}
//   bytes [8+N, EOF)    the data area; offsets are relative to its start.
// Tensors are little-endian, C order (row-major), dense.
//
// Reading (SafetensorsFile::open) maps the file and validates it strictly
// before anything is returned; every failure is a zt::Error that names the
// file and the problem. Rules, in the order they are checked:
//   - the file holds at least the 8-byte length; N <= 100'000'000 (the limit
//     of the reference implementation) and N <= file size - 8;
//   - the header starts with '{' and is well-formed JSON (nlohmann's parser:
//     UTF-8 validated, trailing whitespace only);
//   - it is an object whose members are "__metadata__" (an object of string
//     values) or tensor entries: objects with exactly the keys dtype (a
//     string), shape (at most 8 non-negative integers) and data_offsets (two
//     non-negative integers); no key appears twice at any level;
//   - every dtype is one Zettatron stores (see safetensors_dtype_name);
//   - the element count (product of the shape, overflow-checked) times the
//     dtype size (overflow-checked) equals end - begin, and begin <= end;
//   - every range lies inside the data area;
//   - sorted by offset, the ranges neither overlap nor leave gaps and cover
//     the data area exactly (the format forbids padding between tensors).
//
// Writing (write_safetensors) is deterministic: the same tensors, metadata and
// options always give the same bytes. The JSON is compact (no spaces), each
// entry's keys are dtype, shape, data_offsets in that order, "__metadata__"
// comes first when present, strings are escaped the way serde_json escapes
// them (", \, \b \f \n \r \t, other bytes < 0x20 as \u00xx, everything else
// raw UTF-8), and the header is padded with spaces to a multiple of 8 bytes.
// That is exactly the textual form Python's safetensors (a serde_json writer)
// produces, so `hf_layout` only has to choose its tensor order.
//
// Round trips: a file is `canonical()` when rewriting its tensors (in
// names() order) with its metadata and `layout()` reproduces it byte for
// byte. Every file write_safetensors produces is canonical, and so is every
// file Python's safetensors writes whose metadata has at most one key (its
// metadata is a Rust HashMap, so the order of several keys is random but is
// recorded by layout() all the same).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/durable_file.h"
#include "core/tensor.h"

namespace zt::ckpt {

// The largest header accepted or written (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// The safetensors name of a DType: "F32", "BF16", "F16", "F8_E4M3",
// "F8_E5M2", "I32", "I64", "U16", "U32". (F8_E4M3 is OCP E4M3 "fn", the
// same format as DType::f8e4m3.)
std::string_view safetensors_dtype_name(DType t);
// The DType of a safetensors dtype name, or nullopt for names Zettatron does
// not store (F64, BOOL, U8, I8, I16, U64, ...) and unknown names.
std::optional<DType> dtype_from_safetensors(std::string_view name);

struct TensorInfo {
  DType dtype = DType::f32;
  Shape shape;
  size_t begin = 0;  // byte range [begin, end) relative to the data area
  size_t end = 0;
  size_t nbytes() const { return end - begin; }
};

struct SafetensorsWriteOptions {
  // Tensor order in the data area (and, unless header_order says otherwise,
  // in the header):
  //   false: the order of the `tensors` argument;
  //   true:  the order Python's safetensors uses (since 0.3.0, 2023; still
  //          so in its current source): by dtype, widest first (I64, F32, U32,
  //          I32, BF16, F16, U16, F8_E4M3, F8_E5M2 - the reverse of its Dtype
  //          enum), then by name (bytewise). Every tensor then starts aligned
  //          to its element size. (Versions before 0.3 ordered data and header
  //          by name alone: pass the tensors sorted by name with hf_layout off.)
  bool hf_layout = false;
  // Order of the tensor entries in the header, when it must differ from the
  // data order (a permutation of all tensor names). Empty: the data order.
  std::vector<std::string> header_order = {};
  // These metadata keys are written first, in this order (each must be a key
  // of `metadata`); the remaining keys follow in bytewise order.
  std::vector<std::string> metadata_order = {};
  // Write "__metadata__":{} even when the metadata is empty.
  bool write_empty_metadata = false;
};

// A validated safetensors file (or byte buffer). Copies are cheap and share
// the mapping, which lives until the last copy is destroyed. It is immutable
// once open() or parse() returns, so concurrent use from several threads is safe.
//
// LIFETIME: tensor() returns a Tensor that borrows the mapped bytes
// (Tensor::wrap); it does not keep the mapping alive. Keep a SafetensorsFile
// (any copy) alive for as long as any of its views is used.
//
// The mapping is private and copy-on-write: writing into a view changes this
// process's copy of the page only, never the file. If another process
// truncates the file while it is mapped, touching the lost pages raises
// SIGBUS; write_safetensors never does that (it renames a new file into
// place, so existing mappings keep the old contents).
class SafetensorsFile {
 public:
  // Maps `path` read-only (copy-on-write) and validates it; nothing is copied.
  static SafetensorsFile open(const std::string& path);
  // Validates a file held in memory. The bytes are borrowed: they must outlive
  // the result and its views, and views alias them.
  static SafetensorsFile parse(std::span<const uint8_t> bytes, std::string name_for_errors);

  // The path (or name_for_errors) used in messages.
  const std::string& path() const;
  const std::map<std::string, std::string>& metadata() const;
  // Tensor names in data order (by offset; ties - zero-size tensors - in
  // header order).
  std::vector<std::string> names() const;
  // Tensor names in the order the header lists them.
  std::vector<std::string> header_names() const;
  size_t size() const;  // number of tensors
  bool contains(std::string_view name) const;
  // Throws zt::Error naming the file when there is no such tensor.
  const TensorInfo& info(std::string_view name) const;
  // A CPU tensor viewing the mapped bytes (no copy; see LIFETIME). If the
  // data is not aligned to the element size - possible only in files whose
  // writer did not align, never in hf_layout files - a private aligned copy
  // (MemCategory::workspace) is returned instead.
  Tensor tensor(std::string_view name) const;
  // Every tensor, in data order.
  std::vector<std::pair<std::string, Tensor>> tensors() const;

  // Options that make write_safetensors(path, tensors(), metadata(), layout())
  // reproduce this file's header order and metadata key order.
  SafetensorsWriteOptions layout() const;
  // True when that rewrite is byte-identical to this file.
  bool canonical() const;

  size_t file_size() const;
  size_t header_size() const;  // N
  size_t data_offset() const { return 8 + header_size(); }

 private:
  struct State;
  explicit SafetensorsFile(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes CPU tensors to `path` atomically: the bytes go to path + ".tmp",
// which is fsync'ed and renamed over `path`, then the directory is fsync'ed
// (ckpt/durable_file.h). Returns the file's size and Checksum64.
// Names must be distinct, valid UTF-8 and not "__metadata__"; metadata keys
// and values must be valid UTF-8. Throws zt::Error naming the path and the
// problem (the temporary file is removed on failure).
FileDigest write_safetensors(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata = {},
                             const SafetensorsWriteOptions& options = {});

// The same bytes, in memory (for tests, fuzzing and small files).
std::vector<uint8_t> safetensors_bytes(const NamedTensors& tensors,
                                       const std::map<std::string, std::string>& metadata = {},
                                       const SafetensorsWriteOptions& options = {});

}  // namespace zt::ckpt
