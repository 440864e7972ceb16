#include "ckpt/checkpoint_reader.h"

#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/checkpoint_writer.h"
#include "ckpt/durable_file.h"
#include "core/error.h"
#include "core/hash.h"

namespace zt::ckpt {

namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  ZT_CHECK(in.good(), p.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Copies the intersection of box `src` (elements of a tensor stored
// contiguously with shape src_shape, placed at src_start in global
// coordinates) with box `dst` (likewise) from src to dst. Returns the
// number of elements copied. Inner runs are memcpy'd.
int64_t copy_box_intersection(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_start,
                              char* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_start,
                              size_t elem) {
  const int nd = src_shape.ndim();
  if (nd == 0) {
    std::memcpy(dst, src, elem);
    return 1;
  }
  int64_t lo[Shape::kMaxDims], len[Shape::kMaxDims];
  int64_t volume = 1;
  for (int d = 0; d < nd; ++d) {
    lo[d] = std::max(src_start[size_t(d)], dst_start[size_t(d)]);
    const int64_t hi = std::min(src_start[size_t(d)] + src_shape[d], dst_start[size_t(d)] + dst_shape[d]);
    if (hi <= lo[d]) return 0;
    len[d] = hi - lo[d];
    volume *= len[d];
  }
  // Row-major strides (elements) of both boxes.
  int64_t sstride[Shape::kMaxDims], dstride[Shape::kMaxDims];
  sstride[nd - 1] = dstride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; --d) {
    sstride[d] = sstride[d + 1] * src_shape[d + 1];
    dstride[d] = dstride[d + 1] * dst_shape[d + 1];
  }
  const size_t run = size_t(len[nd - 1]) * elem;
  int64_t idx[Shape::kMaxDims] = {};  // position inside the intersection, outer dims
  const int64_t rows = volume / len[nd - 1];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < nd; ++d) {
      const int64_t g = lo[d] + (d == nd - 1 ? 0 : idx[d]);
      so += (g - src_start[size_t(d)]) * sstride[d];
      doff += (g - dst_start[size_t(d)]) * dstride[d];
    }
    std::memcpy(dst + size_t(doff) * elem, src + size_t(so) * elem, run);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
  return volume;
}

}  // namespace

std::string resolve_checkpoint_path(const std::string& path) {
  const fs::path p(path);
  ZT_CHECK(fs::exists(p), "checkpoint path '", path, "' does not exist");
  if (fs::exists(p / "manifest.json")) return p.string();
  if (auto latest = latest_checkpoint(p.string())) return *latest;
  if (auto latest = latest_checkpoint((p / "checkpoints").string())) return *latest;
  ZT_FAIL("'", path, "' is not a checkpoint: expected a checkpoint directory (holding manifest.json), a checkpoints "
          "directory holding `latest`, or a run directory with checkpoints/latest",
          fs::exists(p / "checkpoints") ? " (its checkpoints/ has no `latest`: no save has completed)" : "");
}

Checkpoint Checkpoint::open(const std::string& path) {
  auto s = std::make_shared<State>();
  s->dir = resolve_checkpoint_path(path);
  const fs::path dir(s->dir);
  ZT_CHECK(fs::exists(dir / "manifest.zt64"), s->dir, " has no manifest.zt64: not a complete checkpoint");
  // The manifest's own checksum first: a corrupted manifest must not steer the loader.
  const std::string sum_line = read_all(dir / "manifest.zt64");
  char hexsum[17] = {};
  unsigned long long bytes = 0;
  const bool parsed = std::sscanf(sum_line.c_str(), "%16[0-9a-f] %llu", hexsum, &bytes) == 2 &&
                      sum_line == std::string(hexsum) + " " + std::to_string(bytes) + " manifest.json\n";
  ZT_CHECK(parsed && std::strlen(hexsum) == 16,
           (dir / "manifest.zt64").string(), " is corrupted (expected '<16 hex digits> <bytes> manifest.json', got '",
           sum_line.substr(0, 80), "')");
  const std::string text = read_all(dir / "manifest.json");
  const uint64_t actual = checksum64(text.data(), text.size());
  ZT_CHECK(text.size() == bytes && hex64(actual) == hexsum, (dir / "manifest.json").string(),
           ": checksum mismatch (file: ", text.size(), " bytes, checksum ", hex64(actual), "; manifest.zt64 says ", bytes,
           " bytes, checksum ", hexsum, "): the checkpoint is corrupted; resume from an earlier one");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ZT_FAIL((dir / "manifest.json").string(), ": not valid JSON: ", e.what());
  }
  s->manifest = Manifest::from_json(j, (dir / "manifest.json").string());
  for (const auto& [name, f] : s->manifest.files) {
    const fs::path fp = dir / name;
    ZT_CHECK(fs::exists(fp), s->dir, ": the manifest lists '", name, "', which is missing");
    const FileDigest d = digest_file(fp.string());
    ZT_CHECK(d.bytes == f.bytes, fp.string(), ": ", d.bytes, " bytes, the manifest says ", f.bytes,
             " (truncated or replaced); the checkpoint is damaged: resume from an earlier one");
    ZT_CHECK(d.checksum == f.checksum, fp.string(), ": checksum mismatch (file ", hex64(d.checksum), ", manifest ",
             hex64(f.checksum), "): the file is corrupted; resume from an earlier checkpoint");
  }
  return Checkpoint(std::move(s));
}

const TensorEntry& Checkpoint::entry(std::string_view name) const {
  auto it = s_->manifest.tensors.find(std::string(name));
  ZT_CHECK(it != s_->manifest.tensors.end(), "the checkpoint ", s_->dir, " has no tensor '", name, "'");
  return it->second;
}

const SafetensorsFile& Checkpoint::file(const std::string& name) const {
  std::lock_guard<std::mutex> lock(s_->mu);
  auto it = s_->files.find(name);
  if (it == s_->files.end()) it = s_->files.emplace(name, SafetensorsFile::open((fs::path(s_->dir) / name).string())).first;
  return it->second;
}

void Checkpoint::read(std::string_view name, const Tensor& dst, const std::vector<int64_t>& start_in) const {
  const TensorEntry& e = entry(name);
  ZT_CHECK(dst.device().is_cpu(), "Checkpoint::read: destination must be a host tensor");
  ZT_CHECK(dst.dtype() == e.dtype, "checkpoint tensor '", name, "' is ", dtype_name(e.dtype), ", the destination is ",
           dtype_name(dst.dtype()));
  ZT_CHECK(dst.shape().ndim() == e.shape.ndim(), "checkpoint tensor '", name, "' has shape ", e.shape.str(),
           ", the destination ", dst.shape().str(), " has another rank");
  const std::vector<int64_t> start = start_in.empty() ? std::vector<int64_t>(size_t(e.shape.ndim()), 0) : start_in;
  ZT_CHECK(start.size() == size_t(e.shape.ndim()), "Checkpoint::read: start has ", start.size(), " dims, tensor '",
           name, "' has ", e.shape.ndim());
  for (int d = 0; d < e.shape.ndim(); ++d)
    ZT_CHECK(start[size_t(d)] >= 0 && start[size_t(d)] + dst.shape()[d] <= e.shape[d], "checkpoint tensor '", name,
             "' ", e.shape.str(), ": the requested box ", dst.shape().str(), " at dimension ", d, " offset ",
             start[size_t(d)], " lies outside it");
  int64_t copied = 0;
  for (const TensorSlice& s : e.slices) {
    const SafetensorsFile& f = file(s.file);
    ZT_CHECK(f.contains(s.key), f.path(), ": no tensor '", s.key, "', which the manifest says holds a slice of '",
             name, "'");
    const TensorInfo& info = f.info(s.key);
    ZT_CHECK(info.shape == s.shape && info.dtype == e.dtype, f.path(), ": '", s.key, "' is ",
             dtype_name(info.dtype), info.shape.str(), ", the manifest says ", dtype_name(e.dtype), s.shape.str());
    const Tensor src = f.tensor(s.key);
    copied += copy_box_intersection(static_cast<const char*>(src.data_ptr()), s.shape, s.start,
                                    static_cast<char*>(dst.data_ptr()), dst.shape(), start, dtype_size(e.dtype));
  }
  ZT_ASSERT(copied == dst.shape().numel(), "slices of '", name, "' covered ", copied, " of ", dst.shape().numel());
}

Tensor Checkpoint::read(std::string_view name, MemCategory category) const {
  const TensorEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu(), category);
  read(name, t);
  return t;
}

}  // namespace zt::ckpt
