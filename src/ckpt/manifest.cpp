#include "ckpt/manifest.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/hash.h"

namespace zt::ckpt {

namespace {

using nlohmann::json;

// Typed field access: a clear error for a missing or mistyped field.
const json& field(const json& j, const char* key, const std::string& where) {
  ZT_CHECK(j.is_object(), where, ": expected a JSON object");
  auto it = j.find(key);
  ZT_CHECK(it != j.end(), where, ": missing field '", key, "'");
  return *it;
}

int64_t int_field(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  ZT_CHECK(v.is_number_integer(), where, ": field '", key, "' must be an integer, got ", v.dump());
  return v.get<int64_t>();
}

std::string str_field(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  ZT_CHECK(v.is_string(), where, ": field '", key, "' must be a string, got ", v.dump());
  return v.get<std::string>();
}

std::vector<int64_t> ints(const json& v, const char* key, const std::string& where) {
  ZT_CHECK(v.is_array() && v.size() <= size_t(Shape::kMaxDims), where, ": '", key,
           "' must be an array of at most ", Shape::kMaxDims, " integers, got ", v.dump());
  std::vector<int64_t> out;
  for (const json& d : v) {
    ZT_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, where, ": '", key,
             "' must hold non-negative integers, got ", v.dump());
    out.push_back(d.get<int64_t>());
  }
  return out;
}

json shape_json(const Shape& s) { return json(std::vector<int64_t>(s.begin(), s.end())); }

// Volume of the intersection of two boxes (0 when disjoint).
int64_t overlap(const TensorSlice& a, const TensorSlice& b) {
  int64_t v = 1;
  for (int d = 0; d < a.shape.ndim(); ++d) {
    const int64_t lo = std::max(a.start[size_t(d)], b.start[size_t(d)]);
    const int64_t hi = std::min(a.start[size_t(d)] + a.shape[d], b.start[size_t(d)] + b.shape[d]);
    if (hi <= lo) return 0;
    v *= hi - lo;
  }
  return v;
}

void boxes_rec(const Shape& s, int dim, int64_t a, int64_t b, std::vector<int64_t>& prefix,
               std::vector<std::pair<std::vector<int64_t>, Shape>>& out) {
  if (a >= b) return;
  const int nd = s.ndim();
  const int64_t inner = s.prod(dim + 1, nd);
  auto push = [&](int64_t first, int64_t count) {  // [first, first + count) along dim, whole below
    std::vector<int64_t> start = prefix;
    Shape extent;
    for (size_t i = 0; i < prefix.size(); ++i) extent.push_back(1);
    start.push_back(first);
    extent.push_back(count);
    for (int d = dim + 1; d < nd; ++d) {
      start.push_back(0);
      extent.push_back(s[d]);
    }
    out.emplace_back(std::move(start), extent);
  };
  const int64_t first = a / inner, last = (b - 1) / inner;  // indices along dim touched
  if (a % inner == 0 && b % inner == 0) return push(first, b / inner - first);
  auto partial = [&](int64_t index, int64_t lo, int64_t hi) {  // part of one sub-tensor
    prefix.push_back(index);
    boxes_rec(s, dim + 1, lo, hi, prefix, out);
    prefix.pop_back();
  };
  if (first == last) return partial(first, a - first * inner, b - first * inner);
  int64_t full_begin = first, full_end = last + 1;
  if (a % inner != 0) {
    partial(first, a - first * inner, inner);
    full_begin = first + 1;
  }
  if (b % inner != 0) full_end = last;
  if (full_end > full_begin) push(full_begin, full_end - full_begin);
  if (b % inner != 0) partial(last, 0, b - last * inner);
}

}  // namespace

std::vector<std::pair<std::vector<int64_t>, Shape>> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end) {
  ZT_ASSERT(0 <= begin && begin <= end && end <= shape.numel(), "flat range [", begin, ", ", end, ") of ",
            shape.str());
  std::vector<std::pair<std::vector<int64_t>, Shape>> out;
  if (shape.ndim() == 0) {
    if (end > begin) out.emplace_back(std::vector<int64_t>{}, Shape{});
    return out;
  }
  std::vector<int64_t> prefix;
  boxes_rec(shape, 0, begin, end, prefix, out);
  return out;
}

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

json Manifest::to_json() const {
  json t = json::object();
  for (const auto& [name, e] : tensors) {
    json slices = json::array();
    for (const TensorSlice& s : e.slices)
      slices.push_back({{"file", s.file}, {"key", s.key}, {"start", s.start}, {"shape", shape_json(s.shape)}});
    t[name] = {{"dtype", std::string(safetensors_dtype_name(e.dtype))}, {"shape", shape_json(e.shape)},
               {"slices", slices}};
  }
  json f = json::object();
  for (const auto& [name, e] : files) f[name] = {{"bytes", e.bytes}, {"checksum", hex64(e.checksum)}};
  return {{"format", kManifestFormat}, {"version", kManifestVersion}, {"step", step},
          {"tokens_seen", tokens_seen}, {"config", config}, {"layout", layout},
          {"state", state}, {"tensors", t}, {"files", f}};
}

json Manifest::part_json() const {
  const json full = to_json();
  return {{"tensors", full["tensors"]}, {"files", full["files"]}};
}

void Manifest::merge_part(const json& part, const std::string& where) { add_entries(part, where); }

Manifest Manifest::from_json(const json& j, const std::string& where) {
  ZT_CHECK(j.is_object(), where, ": not a JSON object");
  const std::string format = str_field(j, "format", where);
  ZT_CHECK(format == kManifestFormat, where, ": format is '", format, "', expected '", kManifestFormat, "'");
  const int64_t version = int_field(j, "version", where);
  ZT_CHECK(version == kManifestVersion, where, ": manifest version ", version, " is not supported (this build reads ",
           kManifestVersion, "); use the Zettatron version that wrote it");
  Manifest m;
  m.step = int_field(j, "step", where);
  m.tokens_seen = int_field(j, "tokens_seen", where);
  m.config = str_field(j, "config", where);
  m.layout = field(j, "layout", where);
  m.state = field(j, "state", where);
  m.add_entries(j, where);
  m.validate(where);
  return m;
}

void Manifest::add_entries(const json& j, const std::string& where) {
  const json& f = field(j, "files", where);
  ZT_CHECK(f.is_object(), where, ": 'files' must be an object");
  for (const auto& [name, e] : f.items()) {
    const std::string w = where + ": file '" + name + "'";
    FileEntry fe;
    const int64_t bytes = int_field(e, "bytes", w);
    ZT_CHECK(bytes >= 0, w, ": negative size");
    fe.bytes = uint64_t(bytes);
    fe.checksum = parse_hex64(str_field(e, "checksum", w), w);
    ZT_CHECK(files.emplace(name, fe).second, w, " is listed twice (two ranks wrote it?)");
  }
  const json& t = field(j, "tensors", where);
  ZT_CHECK(t.is_object(), where, ": 'tensors' must be an object");
  for (const auto& [name, e] : t.items()) {
    const std::string w = where + ": tensor '" + name + "'";
    const std::string dt = str_field(e, "dtype", w);
    const auto dtype = dtype_from_safetensors(dt);
    ZT_CHECK(dtype.has_value(), w, ": unknown dtype '", dt, "'");
    const auto shape_v = ints(field(e, "shape", w), "shape", w);
    const Shape shape(shape_v.begin(), shape_v.end());
    auto [it, fresh] = tensors.try_emplace(name);
    TensorEntry& entry = it->second;
    if (fresh) {
      entry.dtype = *dtype;
      entry.shape = shape;
    }
    ZT_CHECK(entry.dtype == *dtype && entry.shape == shape, w, ": parts disagree on its dtype or shape (",
             dtype_name(entry.dtype), entry.shape.str(), " vs ", dt, shape.str(), ")");
    const json& slices = field(e, "slices", w);
    ZT_CHECK(slices.is_array(), w, ": 'slices' must be an array");
    for (const json& s : slices) {
      TensorSlice slice;
      slice.file = str_field(s, "file", w);
      slice.key = str_field(s, "key", w);
      slice.start = ints(field(s, "start", w), "start", w);
      const auto sh = ints(field(s, "shape", w), "shape", w);
      slice.shape = Shape(sh.begin(), sh.end());
      entry.slices.push_back(std::move(slice));
    }
  }
}

void Manifest::validate(const std::string& where) const {
  for (const auto& [name, e] : tensors) {
    const std::string w = where + ": tensor '" + name + "' " + e.shape.str();
    ZT_CHECK(!e.slices.empty() || e.shape.numel() == 0, w, " has no slices");
    int64_t covered = 0;
    for (const TensorSlice& s : e.slices) {
      ZT_CHECK(files.count(s.file), w, ": slice in file '", s.file, "', which the manifest's 'files' does not list");
      ZT_CHECK(s.start.size() == size_t(e.shape.ndim()) && s.shape.ndim() == e.shape.ndim(), w,
               ": a slice in '", s.file, "' has rank ", s.shape.ndim(), ", the tensor has rank ", e.shape.ndim());
      for (int d = 0; d < e.shape.ndim(); ++d)
        ZT_CHECK(s.start[size_t(d)] + s.shape[d] <= e.shape[d], w, ": the slice ", s.shape.str(), " at dimension ",
                 d, " offset ", s.start[size_t(d)], " in '", s.file, "' reaches past the tensor");
      covered += s.shape.numel();
    }
    // Tiling: no two slices overlap and together they hold every element.
    for (size_t a = 0; a < e.slices.size(); ++a)
      for (size_t b = a + 1; b < e.slices.size(); ++b)
        ZT_CHECK(overlap(e.slices[a], e.slices[b]) == 0, w, ": slices in '", e.slices[a].file, "' and '",
                 e.slices[b].file, "' overlap");
    ZT_CHECK(covered == e.shape.numel(), w, ": the slices hold ", covered, " of ", e.shape.numel(), " elements");
  }
}

}  // namespace zt::ckpt
