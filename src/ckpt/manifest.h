// A checkpoint's manifest.json: what the checkpoint holds and where.
//
//   {"format": "zettatron-checkpoint", "version": 1,
//    "step": 100, "tokens_seen": 819200,
//    "config": "<the run's resolved config, TOML text>",
//    "layout": {"world_size": 1, "dp": 1, ...},      (the parallel layout that wrote it)
//    "state":  {...},                                 (trainer, loader, RNG, schedule: the
//                                                      train layer's business, opaque here)
//    "tensors": {"model.embed.wte": {"dtype": "F32", "shape": [V, C],
//                  "slices": [{"file": "shard-00000.safetensors", "key": "model.embed.wte",
//                              "start": [0, 0], "shape": [V, C]}, ...]}, ...},
//    "files": {"shard-00000.safetensors": {"bytes": 123, "checksum": "0123456789abcdef"}}}
//
// Tensors are described globally (the shape of the whole tensor) and by the
// boxes ("slices") that files hold, so a checkpoint written by one parallel
// layout can be read into another: the reader assembles any box from the
// slices that overlap it. Slices of a tensor must tile it exactly (no gaps,
// no overlaps). Checksums are core/hash.h Checksum64 of each whole file.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace zt::ckpt {

inline constexpr const char* kManifestFormat = "zettatron-checkpoint";
inline constexpr int kManifestVersion = 1;

struct TensorSlice {
  std::string file;            // file name inside the checkpoint directory
  std::string key;             // tensor name inside that safetensors file
  std::vector<int64_t> start;  // first index of the box in every dimension
  Shape shape;                 // the box's extent (== the stored tensor's shape)
};

struct TensorEntry {
  DType dtype = DType::f32;
  Shape shape;  // global
  std::vector<TensorSlice> slices;
};

struct FileEntry {
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

struct Manifest {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  std::string config;  // TOML
  nlohmann::json layout = nlohmann::json::object();
  nlohmann::json state = nlohmann::json::object();
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, FileEntry> files;

  nlohmann::json to_json() const;
  // Parses and validates (see validate); `where` names the file in errors.
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
  // Every slice inside its tensor and of its rank, slices tiling each tensor
  // exactly, every file named by a slice listed in `files`. Throws zt::Error
  // naming `where`, the tensor and the problem.
  void validate(const std::string& where) const;

  // The tensors and files alone (what one rank wrote), and adding another
  // rank's part: the slices of a tensor from every rank together tile it.
  nlohmann::json part_json() const;
  void merge_part(const nlohmann::json& part, const std::string& where);

 private:
  // Adds the "tensors" and "files" of j (slices appended to existing entries).
  void add_entries(const nlohmann::json& j, const std::string& where);
};

// The boxes that make up elements [begin, end) of a row-major tensor of
// `shape`, in flat order: each box is also a contiguous run of the flat
// range, so a flat shard (ZeRO) is stored as at most 2 ndim - 1 boxes of the
// global tensor. Pairs of (start, extent).
std::vector<std::pair<std::vector<int64_t>, Shape>> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end);

// "step_00000100": the directory name of the checkpoint of `step`.
std::string checkpoint_dir_name(int64_t step);

}  // namespace zt::ckpt
