// Reading a checkpoint directory (ckpt/checkpoint_writer.h): every file is
// checked against the manifest's size and checksum before anything is used,
// and any box of any tensor is assembled from whichever files hold slices
// of it - which is how a checkpoint written by one parallel layout is loaded
// into another (resharding).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "core/tensor.h"

namespace zt::ckpt {

// A checkpoint directory from what the user typed: a checkpoint directory
// (holding manifest.json), a checkpoints directory holding `latest`, or a
// run directory whose checkpoints/latest exists. Errors say which of these
// was expected and what the path holds.
std::string resolve_checkpoint_path(const std::string& path);

class Checkpoint {
 public:
  // Opens the checkpoint `resolve_checkpoint_path(path)` names: checks the
  // manifest against manifest.zt64, parses and validates it, then checks
  // every file it lists (present, size, checksum). Errors name the file.
  static Checkpoint open(const std::string& path);

  const std::string& dir() const { return s_->dir; }
  const Manifest& manifest() const { return s_->manifest; }
  bool contains(std::string_view name) const { return s_->manifest.tensors.count(std::string(name)) != 0; }
  // Throws zt::Error naming the checkpoint and the tensor when absent.
  const TensorEntry& entry(std::string_view name) const;

  // Copies the box [start, start + dst.shape()) of tensor `name` into dst (a
  // CPU tensor of the stored dtype and the tensor's rank), from every slice
  // that overlaps it. start empty: the origin.
  void read(std::string_view name, const Tensor& dst, const std::vector<int64_t>& start = {}) const;
  // The whole tensor, as a new CPU tensor.
  Tensor read(std::string_view name, MemCategory category = MemCategory::workspace) const;

 private:
  struct State {
    std::string dir;
    Manifest manifest;
    mutable std::mutex mu;
    mutable std::map<std::string, SafetensorsFile> files;  // opened on first use
  };
  explicit Checkpoint(std::shared_ptr<State> s) : s_(std::move(s)) {}
  const SafetensorsFile& file(const std::string& name) const;
  std::shared_ptr<State> s_;
};

}  // namespace zt::ckpt
