#include "ckpt/checkpoint_writer.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "ckpt/durable_file.h"
#include "ckpt/safetensors.h"
#include "core/error.h"

namespace zt::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStagingPrefix = ".tmp-";
constexpr const char* kLatest = "latest";

// Test-only fault injection: ZT_CKPT_FAILPOINT=before_commit (or
// before_commit:STEP, only for that step's checkpoint) kills the process with
// SIGKILL, as a node failure would, after every file of a checkpoint is
// written and fsync'ed but before the rename that commits it.
void failpoint(const std::string& name, int64_t step) {
  const char* fp = std::getenv("ZT_CKPT_FAILPOINT");
  if (!fp) return;
  const std::string v = fp;
  if (v == name || v == name + ":" + std::to_string(step)) {
    std::fprintf(stderr, "ZT_CKPT_FAILPOINT=%s: killing the process while saving step %lld\n", fp, (long long)step);
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
}

std::optional<int64_t> step_of_dir_name(const std::string& name) {
  if (name.size() < 6 || name.rfind("step_", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(digits);
}

void remove_all_or_throw(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  ZT_CHECK(!ec, "cannot remove ", p.string(), ": ", ec.message());
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string root, int64_t step)
    : CheckpointWriter(root, (fs::path(root) / (kStagingPrefix + checkpoint_dir_name(step))).string(),
                       (fs::path(root) / checkpoint_dir_name(step)).string(), step, true) {}

std::unique_ptr<CheckpointWriter> CheckpointWriter::standalone(const std::string& dir, int64_t step) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/" -> "out"
  const std::string root = p.has_parent_path() ? p.parent_path().string() : std::string(".");
  const std::string staging = (fs::path(root) / (kStagingPrefix + p.filename().string())).string();
  return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(root, staging, p.string(), step, false));
}

std::unique_ptr<CheckpointWriter> CheckpointWriter::join(const std::string& root, int64_t step) {
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->root_ = root;
  w->staging_ = (fs::path(root) / (kStagingPrefix + checkpoint_dir_name(step))).string();
  w->final_ = (fs::path(root) / checkpoint_dir_name(step)).string();
  w->joined_ = true;
  w->manifest_.step = step;
  ZT_CHECK(fs::is_directory(w->staging_), "checkpoint of step ", step, ": the staging directory ", w->staging_,
           " does not exist (the main rank creates it first; is ", root, " on a filesystem every rank shares?)");
  return w;
}

CheckpointWriter::CheckpointWriter(std::string root, std::string staging, std::string final_dir, int64_t step,
                                   bool update_latest)
    : root_(std::move(root)), staging_(std::move(staging)), final_(std::move(final_dir)),
      update_latest_(update_latest) {
  ZT_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  ZT_CHECK(!fs::exists(final_), "the checkpoint ", final_,
           " exists already and is never overwritten; choose another step or path, or move it away");
  std::error_code ec;
  fs::create_directories(root_, ec);
  ZT_CHECK(!ec, "cannot create the checkpoint directory ", root_, ": ", ec.message());
  if (fs::exists(staging_)) remove_all_or_throw(staging_);  // left by a crashed save of this step
  fs::create_directory(staging_, ec);
  ZT_CHECK(!ec, "cannot create ", staging_, ": ", ec.message());
  manifest_.step = step;
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_ && !joined_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);  // best effort; the next save removes it otherwise
  }
}

void CheckpointWriter::write_file(const std::string& file, const std::vector<SliceToWrite>& slices) {
  ZT_CHECK(!committed_, "write_file after commit");
  ZT_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "manifest.json" &&
               file != "manifest.zt64",
           "checkpoint file name '", file, "' must be a plain file name");
  ZT_CHECK(!manifest_.files.count(file), "checkpoint file '", file, "' is written twice");
  // Keys inside the file: the tensor's name, or name#k when one file holds
  // several slices of the same tensor.
  std::map<std::string, int> count;
  for (const SliceToWrite& s : slices) ++count[s.name];
  std::map<std::string, int> seen;
  NamedTensors tensors;
  std::vector<std::pair<std::string, TensorSlice>> records;
  for (const SliceToWrite& s : slices) {
    ZT_CHECK(s.data.device().is_cpu(), "checkpoint slice '", s.name, "' must be a host tensor");
    const std::string key = count[s.name] == 1 ? s.name : s.name + "#" + std::to_string(seen[s.name]++);
    TensorSlice slice;
    slice.file = file;
    slice.key = key;
    slice.start = s.start.empty() ? std::vector<int64_t>(size_t(s.global_shape.ndim()), 0) : s.start;
    slice.shape = s.data.shape();
    auto [it, fresh] = manifest_.tensors.try_emplace(s.name);
    TensorEntry& e = it->second;
    if (fresh) {
      e.dtype = s.data.dtype();
      e.shape = s.global_shape;
    } else {
      ZT_CHECK(e.dtype == s.data.dtype() && e.shape == s.global_shape, "checkpoint tensor '", s.name,
               "' is written as ", dtype_name(s.data.dtype()), s.global_shape.str(), " and as ", dtype_name(e.dtype),
               e.shape.str());
    }
    tensors.emplace_back(key, s.data);
    records.emplace_back(s.name, std::move(slice));
  }
  const FileDigest d = write_safetensors((fs::path(staging_) / file).string(), tensors, {{"format", "zettatron"}});
  manifest_.files[file] = FileEntry{d.bytes, d.checksum};
  for (auto& [name, slice] : records) manifest_.tensors[name].slices.push_back(std::move(slice));
}

std::string CheckpointWriter::commit() {
  ZT_CHECK(!committed_, "commit twice");
  ZT_ASSERT(!joined_, "only the rank that staged a checkpoint commits it");
  manifest_.validate(staging_ + "/manifest.json");
  const std::string text = manifest_.to_json().dump(1) + "\n";
  DurableWriter mw((fs::path(staging_) / "manifest.json").string());
  mw.write(text.data(), text.size());
  mw.commit();
  write_file_durably((fs::path(staging_) / "manifest.zt64").string(),
                     hex64(mw.checksum()) + " " + std::to_string(mw.bytes()) + " manifest.json\n");
  fsync_directory(staging_);
  failpoint("before_commit", manifest_.step);
  std::error_code ec;
  fs::rename(staging_, final_, ec);
  ZT_CHECK(!ec, "cannot rename ", staging_, " to ", final_, ": ", ec.message());
  fsync_directory(root_);
  committed_ = true;
  if (update_latest_)
    write_file_durably((fs::path(root_) / kLatest).string(), fs::path(final_).filename().string() + "\n");
  return final_;
}

std::vector<int64_t> list_checkpoints(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto step = step_of_dir_name(entry.path().filename().string());
    if (step && fs::exists(entry.path() / "manifest.json")) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  const fs::path p = fs::path(root) / kLatest;
  if (!fs::exists(p)) return std::nullopt;
  std::ifstream in(p);
  std::string name;
  std::getline(in, name);
  ZT_CHECK(step_of_dir_name(name).has_value(), p.string(), " holds '", name,
           "', not a checkpoint name (step_NNNNNNNN); fix or delete it, or resume from an explicit path");
  return (fs::path(root) / name).string();
}

std::optional<int64_t> latest_checkpoint_step(const std::string& root) {
  const auto latest = latest_checkpoint(root);
  if (!latest) return std::nullopt;
  return step_of_dir_name(fs::path(*latest).filename().string());
}

std::vector<std::string> prune_checkpoints(const std::string& root, const RetentionPolicy& policy) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kStagingPrefix, 0) == 0 && entry.is_directory()) {
      remove_all_or_throw(entry.path());
      removed.push_back(name);
    }
  }
  const std::vector<int64_t> steps = list_checkpoints(root);
  if (policy.keep_last <= 0) return removed;
  std::set<int64_t> keep;
  for (size_t i = steps.size() > size_t(policy.keep_last) ? steps.size() - size_t(policy.keep_last) : 0;
       i < steps.size(); ++i)
    keep.insert(steps[i]);
  if (policy.keep_every > 0)
    for (int64_t s : steps)
      if (s % policy.keep_every == 0) keep.insert(s);
  if (const auto latest = latest_checkpoint(root))
    if (const auto s = step_of_dir_name(fs::path(*latest).filename().string())) keep.insert(*s);
  for (int64_t s : steps)
    if (!keep.count(s)) {
      remove_all_or_throw(fs::path(root) / checkpoint_dir_name(s));
      removed.push_back(checkpoint_dir_name(s));
    }
  return removed;
}

BackgroundWriter::~BackgroundWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "error: a background checkpoint write failed: " << e.what() << std::endl;
  }
}

void BackgroundWriter::submit(std::function<void()> job) {
  wait();
  thread_ = std::thread([this, job = std::move(job)] {
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> l(mu_);
    error_ = err;
  });
}

void BackgroundWriter::wait() {
  if (thread_.joinable()) thread_.join();
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(err, error_);
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace zt::ckpt
