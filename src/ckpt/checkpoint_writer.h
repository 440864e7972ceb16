// Writing a checkpoint directory with a crash-safe commit, and keeping the
// checkpoints directory tidy.
//
// Layout (ROOT is usually RUN_DIR/checkpoints):
//   ROOT/step_00000100/manifest.json     what is where (ckpt/manifest.h)
//   ROOT/step_00000100/manifest.zt64     "<checksum> <bytes> manifest.json": the manifest's own checksum
//   ROOT/step_00000100/*.safetensors     the tensors' slices
//   ROOT/latest                          "step_00000100\n": the newest complete checkpoint
//
// Commit protocol: every file is written into ROOT/.tmp-step_NNNNNNNN, each
// fsync'ed; then the manifest and its checksum; the staging directory is
// fsync'ed and renamed to ROOT/step_NNNNNNNN; ROOT is fsync'ed; ROOT/latest is
// replaced (write + fsync + rename) last. A crash at any point leaves either
// the previous `latest` or the new one, and a staging directory that no
// reader ever takes for a checkpoint (the next save removes it). An existing
// step directory is never written into.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/manifest.h"
#include "core/tensor.h"

namespace zt::ckpt {

// One box of a global tensor, to be stored: `data` (CPU, shape = the box's
// extent) holds elements [start, start + data.shape()) of tensor `name`,
// whose full shape is `global_shape`.
struct SliceToWrite {
  std::string name;
  Shape global_shape;
  std::vector<int64_t> start;  // empty: the origin
  Tensor data;
};

class CheckpointWriter {
 public:
  // Stages the checkpoint of `step` under `root` (created if missing).
  // Throws zt::Error when root/step_NNNNNNNN exists already.
  CheckpointWriter(std::string root, int64_t step);
  // A checkpoint written straight to `dir` (staged in DIR.tmp-, renamed into
  // place; no `latest` is touched): conversions and exports. Throws when dir exists.
  static std::unique_ptr<CheckpointWriter> standalone(const std::string& dir, int64_t step);
  // Another rank's view of a checkpoint being staged by the main rank (which
  // constructed it first): write_file() into the same staging directory,
  // then hand manifest().part_json() to the main rank, which merges it
  // (Manifest::merge_part) and commits. Never removes or commits anything.
  static std::unique_ptr<CheckpointWriter> join(const std::string& root, int64_t step);
  ~CheckpointWriter();  // without commit(): the staging directory is removed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Writes `file` (a safetensors file name) holding these slices and records
  // them and the file's checksum in manifest(). Slices of one tensor written
  // by different calls (or ranks) must tile it; commit() checks.
  void write_file(const std::string& file, const std::vector<SliceToWrite>& slices);
  // The manifest being built: step is set; callers fill config, layout,
  // state and tokens_seen.
  Manifest& manifest() { return manifest_; }
  // Validates the manifest, writes it, commits (see the protocol above) and
  // returns the checkpoint's directory.
  std::string commit();

 private:
  CheckpointWriter() = default;
  CheckpointWriter(std::string root, std::string staging, std::string final_dir, int64_t step, bool update_latest);
  std::string root_, staging_, final_;
  Manifest manifest_;
  bool update_latest_ = true;
  bool joined_ = false;
  bool committed_ = false;
};

// Committed checkpoints under root (directories step_N holding manifest.json), by step.
std::vector<int64_t> list_checkpoints(const std::string& root);

// The directory root/latest points to, or nullopt when there is no `latest`.
std::optional<std::string> latest_checkpoint(const std::string& root);
// Its step, from its name (no file of it opened); nullopt without `latest`.
std::optional<int64_t> latest_checkpoint_step(const std::string& root);

// Which checkpoints to keep: the newest keep_last (0: all) and every step
// that is a multiple of keep_every (0: none beyond the newest) - and always
// the one `latest` names.
struct RetentionPolicy {
  int64_t keep_last = 0;
  int64_t keep_every = 0;
};
// Deletes the committed checkpoints the policy does not keep and staging
// directories left by crashed saves; returns the deleted directory names.
std::vector<std::string> prune_checkpoints(const std::string& root, const RetentionPolicy& policy);

// Runs checkpoint writes on a background thread, one at a time: submit()
// waits for the previous write to finish (rethrowing its error) before
// starting the next; wait() does the same without starting anything.
class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  ~BackgroundWriter();  // waits; an error at that point is reported on stderr
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  void submit(std::function<void()> job);
  void wait();

 private:
  std::thread thread_;
  std::exception_ptr error_;
  std::mutex mu_;
};

}  // namespace zt::ckpt
