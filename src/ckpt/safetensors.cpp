// safetensors reader (mmap + strict validation) and deterministic writer.
// See safetensors.h for the format, the validation rules and the layouts.
#include "ckpt/safetensors.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <unordered_set>

#include "ckpt/durable_file.h"
#include "core/error.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts would need byte swapping");

namespace zt::ckpt {
namespace {

// --- dtype names -------------------------------------------------------------

struct DTypeName {
  DType dtype;
  std::string_view name;
  // Position in Python safetensors' Dtype enum, which is ordered by
  // alignment; hf_layout sorts by it, descending. Only the order matters.
  int hf_rank;
};

constexpr std::array<DTypeName, kNumDTypes> kDTypeNames = {{
    {DType::f8e5m2, "F8_E5M2", 6},
    {DType::f8e4m3, "F8_E4M3", 7},
    {DType::u16, "U16", 12},
    {DType::f16, "F16", 13},
    {DType::bf16, "BF16", 14},
    {DType::i32, "I32", 15},
    {DType::u32, "U32", 16},
    {DType::f32, "F32", 17},
    {DType::i64, "I64", 20},
}};

constexpr bool every_dtype_named_once() {
  for (int i = 0; i < kNumDTypes; ++i) {
    int n = 0;
    for (const DTypeName& e : kDTypeNames) n += int(e.dtype) == i;
    if (n != 1) return false;
  }
  return true;
}
static_assert(every_dtype_named_once(), "add the new DType to kDTypeNames (its safetensors name and rank)");

// safetensors dtypes that exist in the format but that Zettatron does not store.
constexpr std::array<std::string_view, 13> kUnsupportedDTypes = {
    "BOOL", "U8", "I8", "I16", "U64", "F64", "C64", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ"};

const DTypeName& dtype_entry(DType t) {
  for (const DTypeName& e : kDTypeNames)
    if (e.dtype == t) return e;
  ZT_ASSERT(false, "DType ", int(t), " missing from kDTypeNames");
  return kDTypeNames[0];
}

std::string supported_dtype_list() {
  std::string s;
  for (const DTypeName& e : kDTypeNames) s += std::string(s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

// --- strings -----------------------------------------------------------------

// A name for an error message: quoted, control bytes escaped, long names cut.
std::string quote(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  size_t n = 0;
  for (unsigned char c : s) {
    if (++n > 120) {
      out += "...";
      break;
    }
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      if (c == '\'' || c == '\\') out += '\\';
      out += char(c);
    }
  }
  return out + "'";
}

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07u;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return false;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return false;
    i += len;
  }
  return true;
}

// A JSON string literal, escaped the way serde_json (and Python's json with
// ensure_ascii=False) escapes: ", \, the short escapes for \b \f \n \r \t,
// other control bytes as \u00xx (lowercase hex), everything else raw.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void append_uint(std::string& out, uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  std::string s(1, '[');  // built by appending: GCC 12 warns falsely on "literal" + std::string
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += ')';
  return s;
}


// --- header rendering (shared by the writer and canonical()) ------------------

struct HeaderItem {
  std::string_view name;
  DType dtype;
  const Shape* shape;
  uint64_t begin, end;
};
using MetaList = std::vector<std::pair<std::string_view, std::string_view>>;

std::string render_header(const std::vector<HeaderItem>& items, const MetaList& meta, bool emit_meta) {
  std::string h = "{";
  bool first = true;
  if (emit_meta) {
    append_json_string(h, "__metadata__");
    h += ":{";
    for (size_t i = 0; i < meta.size(); ++i) {
      if (i) h += ',';
      append_json_string(h, meta[i].first);
      h += ':';
      append_json_string(h, meta[i].second);
    }
    h += '}';
    first = false;
  }
  for (const HeaderItem& it : items) {
    if (!first) h += ',';
    first = false;
    append_json_string(h, it.name);
    h += ":{\"dtype\":";
    append_json_string(h, safetensors_dtype_name(it.dtype));
    h += ",\"shape\":[";
    for (int d = 0; d < it.shape->ndim(); ++d) {
      if (d) h += ',';
      append_uint(h, uint64_t((*it.shape)[d]));
    }
    h += "],\"data_offsets\":[";
    append_uint(h, it.begin);
    h += ',';
    append_uint(h, it.end);
    h += "]}";
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

// --- header parsing ----------------------------------------------------------

struct RawEntry {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> offsets;
  unsigned seen = 0;  // bit per Field
};

enum Field : unsigned { kDType = 1, kShape = 2, kOffsets = 4 };

// A SAX handler that accepts exactly the safetensors header grammar and
// records the entries in header order. Duplicate keys (which nlohmann's DOM
// parser would silently collapse) are errors, and so is nesting deeper than
// the grammar allows, so memory stays proportional to the header.
class HeaderSax {
 public:
  using json = nlohmann::json;
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  std::string error;  // why the header was rejected (empty: accepted)
  std::vector<RawEntry> entries;
  std::vector<std::pair<std::string, std::string>> metadata;  // header order
  bool has_metadata = false;
  bool complete() const { return in_ == In::done; }

  bool null() { return other("null"); }
  bool boolean(bool) { return other("a boolean"); }
  bool number_integer(number_integer_t v) {
    if (in_ == In::shape || in_ == In::offsets) {
      if (v < 0) return fail(where() + " contains the negative value " + std::to_string(v));
      return element(uint64_t(v));  // "-0"
    }
    return other("a number");
  }
  bool number_unsigned(number_unsigned_t v) {
    if (in_ == In::shape || in_ == In::offsets) return element(v);
    return other("a number");
  }
  bool number_float(number_float_t, const string_t& token) {
    if (in_ == In::shape || in_ == In::offsets)
      return fail(where() + " contains " + quote(token) + ", which is not a non-negative 64-bit integer");
    return other("a number");
  }
  bool string(string_t& v) {
    if (in_ == In::metadata) {
      metadata.emplace_back(std::move(key_), std::move(v));
      return true;
    }
    if (in_ == In::tensor && field_ == kDType) {
      entries.back().dtype = std::move(v);
      return true;
    }
    return other("a string");
  }
  bool binary(binary_t&) { return other("binary data"); }

  bool start_object(std::size_t) {
    if (in_ == In::nothing) {
      in_ = In::root;
      return true;
    }
    if (in_ == In::root) {
      if (key_ == "__metadata__") {
        in_ = In::metadata;
        has_metadata = true;
      } else {
        entries.push_back(RawEntry{std::move(key_), {}, {}, {}, 0});
        in_ = In::tensor;
      }
      keys_.clear();
      return true;
    }
    return other("an object");
  }
  bool key(string_t& k) {
    if (in_ == In::root) {
      if (!root_keys_.insert(k).second)
        return fail(k == "__metadata__" ? std::string("\"__metadata__\" appears twice")
                                        : "tensor " + quote(k) + " appears twice");
    } else if (in_ == In::metadata) {
      if (!keys_.insert(k).second) return fail("__metadata__ has the key " + quote(k) + " twice");
    } else if (in_ == In::tensor) {
      RawEntry& e = entries.back();
      if (k == "dtype") {
        field_ = kDType;
      } else if (k == "shape") {
        field_ = kShape;
      } else if (k == "data_offsets") {
        field_ = kOffsets;
      } else {
        return fail("tensor " + quote(e.name) + " has the unknown key " + quote(k) +
                    " (allowed: dtype, shape, data_offsets)");
      }
      if (e.seen & field_) return fail("tensor " + quote(e.name) + " has the key " + quote(k) + " twice");
      e.seen |= field_;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (in_ == In::tensor) {
      const RawEntry& e = entries.back();
      for (auto [bit, name] : {std::pair{kDType, "dtype"}, {kShape, "shape"}, {kOffsets, "data_offsets"}})
        if (!(e.seen & bit)) return fail("tensor " + quote(e.name) + " has no '" + name + "'");
      in_ = In::root;
    } else if (in_ == In::metadata) {
      in_ = In::root;
    } else if (in_ == In::root) {
      in_ = In::done;
    }
    return true;
  }
  bool start_array(std::size_t) {
    if (in_ == In::tensor && field_ == kShape) {
      in_ = In::shape;
      return true;
    }
    if (in_ == In::tensor && field_ == kOffsets) {
      in_ = In::offsets;
      return true;
    }
    return other("an array");
  }
  bool end_array() {
    if (in_ == In::offsets && entries.back().offsets.size() != 2)
      return fail(where() + " must hold 2 integers [begin, end], not " +
                  std::to_string(entries.back().offsets.size()));
    in_ = In::tensor;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    if (const size_t p = what.find("] "); what.rfind("[json.exception", 0) == 0 && p != std::string::npos)
      what = what.substr(p + 2);
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    for (char& c : what)
      if (static_cast<unsigned char>(c) < 0x20) c = '?';
    return fail("the header is not valid JSON: " + what);
  }

 private:
  enum class In { nothing, root, metadata, tensor, shape, offsets, done };
  In in_ = In::nothing;
  unsigned field_ = 0;
  std::string key_;  // the key whose value comes next
  std::unordered_set<std::string> root_keys_, keys_;

  bool fail(std::string msg) {
    error = std::move(msg);
    return false;
  }
  std::string where() const {
    return "tensor " + quote(entries.back().name) + ": '" + (in_ == In::shape ? "shape" : "data_offsets") + "'";
  }
  bool element(uint64_t v) {
    RawEntry& e = entries.back();
    if (in_ == In::shape) {
      if (e.shape.size() == size_t(Shape::kMaxDims))
        return fail("tensor " + quote(e.name) + " has more than " + std::to_string(Shape::kMaxDims) +
                    " dimensions, the most Zettatron supports");
      if (v > uint64_t(std::numeric_limits<int64_t>::max()))
        return fail(where() + " has the dimension " + std::to_string(v) + ", which is too large");
      e.shape.push_back(v);
    } else {
      if (e.offsets.size() == 2) return fail(where() + " must hold 2 integers [begin, end], not more");
      e.offsets.push_back(v);
    }
    return true;
  }
  // A value of the wrong kind for where it appears.
  bool other(const char* kind) {
    switch (in_) {
      case In::nothing: return fail(std::string("the header is ") + kind + ", not a JSON object");
      case In::root:
        if (key_ == "__metadata__") return fail(std::string("\"__metadata__\" is ") + kind + ", not an object");
        return fail("tensor " + quote(key_) + " is " + kind +
                    ", not an object with dtype, shape and data_offsets");
      case In::metadata:
        return fail("__metadata__ value of " + quote(key_) + " is " + kind + "; metadata values must be strings");
      case In::tensor: {
        const std::string name = quote(entries.back().name);
        if (field_ == kDType) return fail("tensor " + name + ": 'dtype' is " + kind + ", not a string");
        if (field_ == kShape)
          return fail("tensor " + name + ": 'shape' is " + kind + ", not an array of non-negative integers");
        return fail("tensor " + name + ": 'data_offsets' is " + kind + ", not an array [begin, end]");
      }
      case In::shape:
      case In::offsets: return fail(where() + " contains " + kind + "; only non-negative integers are allowed");
      case In::done: break;
    }
    return fail(std::string("unexpected ") + kind + " after the header object");
  }
};

}  // namespace

// --- public dtype mapping ------------------------------------------------------

std::string_view safetensors_dtype_name(DType t) { return dtype_entry(t).name; }

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const DTypeName& e : kDTypeNames)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

// --- SafetensorsFile -----------------------------------------------------------

struct SafetensorsFile::State {
  std::string path;
  void* map_addr = nullptr;  // null for parse()
  size_t map_len = 0;
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  size_t header_len = 0;
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;
  std::vector<std::string> metadata_order;  // header order
  struct Entry {
    std::string name;
    TensorInfo info;
  };
  std::vector<Entry> entries;                        // header order
  std::vector<size_t> by_offset;                     // data order (indices into entries)
  std::map<std::string, size_t, std::less<>> index;  // name -> entries index

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (map_addr) ::munmap(map_addr, map_len);
  }

  const Entry& entry(std::string_view name) const {
    const auto it = index.find(name);
    ZT_CHECK(it != index.end(), path, ": no tensor named ", quote(name), " (the file has ", entries.size(),
             " tensors)");
    return entries[it->second];
  }

  void validate();
};

void SafetensorsFile::State::validate() {
  const std::string& f = path;
  ZT_CHECK(size >= 8, f, ": the file is ", size, " bytes, too short for the 8-byte header length (truncated?)");
  uint64_t n;
  std::memcpy(&n, bytes, 8);
  ZT_CHECK(n <= kSafetensorsMaxHeaderBytes, f, ": header length ", n, " exceeds the limit of ",
           kSafetensorsMaxHeaderBytes, " bytes (corrupt or not a safetensors file?)");
  ZT_CHECK(n <= size - 8, f, ": header length ", n, " exceeds the ", size - 8,
           " bytes that follow the length field (truncated file?)");
  header_len = size_t(n);
  const char* h = reinterpret_cast<const char*>(bytes + 8);
  ZT_CHECK(header_len > 0 && h[0] == '{', f,
           ": the header is not a JSON object (it must start with '{'; not a safetensors file?)");

  // nlohmann's lexer takes a NUL byte for the end of the input, which would
  // let anything after one through; JSON text never contains a raw NUL.
  if (const void* nul = std::memchr(h, 0, header_len))
    ZT_FAIL(f, ": the header is not valid JSON: it contains a NUL byte at offset ",
            static_cast<const char*>(nul) - h);

  HeaderSax sax;
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(h, h + header_len, &sax, nlohmann::json::input_format_t::json,
                                   /*strict=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    ZT_FAIL(f, ": the header is not valid JSON: ", e.what());
  }
  ZT_CHECK(ok && sax.error.empty(), f, ": ", sax.error.empty() ? "the header is not valid JSON" : sax.error);
  ZT_ASSERT(sax.complete());

  const uint64_t data_size = size - 8 - header_len;
  entries.reserve(sax.entries.size());
  for (RawEntry& r : sax.entries) {
    const std::string name = quote(r.name);
    const std::optional<DType> dt = dtype_from_safetensors(r.dtype);
    if (!dt) {
      const bool known = std::find(kUnsupportedDTypes.begin(), kUnsupportedDTypes.end(), r.dtype) !=
                         kUnsupportedDTypes.end();
      ZT_FAIL(f, ": tensor ", name, " has dtype ", quote(r.dtype),
              known ? ", which Zettatron does not support" : ", which is not a safetensors dtype",
              " (supported: ", supported_dtype_list(), ")");
    }
    Shape shape;
    int64_t numel = 1;
    for (uint64_t d : r.shape) {
      shape.push_back(int64_t(d));  // <= INT64_MAX and <= kMaxDims dims: checked by the parser
    }
    for (uint64_t d : r.shape)
      ZT_CHECK(!__builtin_mul_overflow(numel, int64_t(d), &numel), f, ": tensor ", name, " has shape ", shape.str(),
               ", whose element count overflows 64 bits");
    uint64_t nbytes;
    ZT_CHECK(!__builtin_mul_overflow(uint64_t(numel), uint64_t(dtype_size(*dt)), &nbytes), f, ": tensor ", name,
             " has shape ", shape.str(), " x ", dtype_name(*dt), ", whose byte size overflows 64 bits");
    const uint64_t begin = r.offsets[0], end = r.offsets[1];
    ZT_CHECK(begin <= end, f, ": tensor ", name, " data_offsets ", offsets_str(begin, end), " have begin > end");
    ZT_CHECK(end - begin == nbytes, f, ": tensor ", name, " data_offsets ", offsets_str(begin, end),
             " do not match shape ", shape.str(), " x ", dtype_name(*dt), " = ", nbytes, " bytes");
    ZT_CHECK(end <= data_size, f, ": tensor ", name, " data_offsets ", offsets_str(begin, end),
             " lie outside the data area of ", data_size, " bytes (truncated file?)");
    entries.push_back(Entry{std::move(r.name), TensorInfo{*dt, shape, size_t(begin), size_t(end)}});
  }

  // Sorted by offset, the ranges must tile the data area exactly.
  by_offset.resize(entries.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::stable_sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    const TensorInfo &x = entries[a].info, &y = entries[b].info;
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (size_t i : by_offset) {
    const Entry& e = entries[i];
    ZT_CHECK(e.info.begin >= pos, f, ": tensor ", quote(e.name), " data_offsets ",
             offsets_str(e.info.begin, e.info.end), " overlap tensor ", quote(prev->name), " ",
             offsets_str(prev->info.begin, prev->info.end));
    ZT_CHECK(e.info.begin == pos, f, ": bytes ", offsets_str(pos, e.info.begin),
             " of the data area belong to no tensor (a gap ",
             prev ? "between " + quote(prev->name) + " and " : std::string("before "), quote(e.name), ")");
    pos = e.info.end;
    prev = &e;
  }
  ZT_CHECK(pos == data_size, f, ": bytes ", offsets_str(pos, data_size), " at the end of the data area belong to no ",
           "tensor (", prev ? "the last one, " + quote(prev->name) + ", ends at " + std::to_string(pos)
                            : std::string("the header lists no tensors"), ")");

  for (size_t i = 0; i < entries.size(); ++i) index.emplace(entries[i].name, i);
  has_metadata = sax.has_metadata;
  for (auto& [k, v] : sax.metadata) {
    metadata_order.push_back(k);
    metadata.emplace(std::move(k), std::move(v));
  }
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string name_for_errors) {
  auto s = std::make_shared<State>();
  s->path = std::move(name_for_errors);
  s->bytes = bytes.data();
  s->size = bytes.size();
  s->validate();
  return SafetensorsFile(std::move(s));
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZT_CHECK(fd >= 0, path, ": cannot open: ", errno_text(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  ZT_CHECK(::fstat(fd, &st) == 0, path, ": cannot stat: ", errno_text(errno));
  ZT_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  const size_t size = size_t(st.st_size);
  ZT_CHECK(size >= 8, path, ": the file is ", size, " bytes, too short for the 8-byte header length (truncated?)");
  // Private + writable: writes through a view are copy-on-write and never
  // reach the file; NORESERVE: no swap is reserved for pages never written.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  ZT_CHECK(addr != MAP_FAILED, path, ": cannot map ", size, " bytes: ", errno_text(errno));
  auto s = std::make_shared<State>();
  s->map_addr = addr;
  s->map_len = size;
  s->path = path;
  s->bytes = static_cast<const uint8_t*>(addr);
  s->size = size;
  s->validate();
  return SafetensorsFile(std::move(s));
}

const std::string& SafetensorsFile::path() const { return s_->path; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return s_->metadata; }
size_t SafetensorsFile::size() const { return s_->entries.size(); }
size_t SafetensorsFile::file_size() const { return s_->size; }
size_t SafetensorsFile::header_size() const { return s_->header_len; }
bool SafetensorsFile::contains(std::string_view name) const { return s_->index.find(name) != s_->index.end(); }
const TensorInfo& SafetensorsFile::info(std::string_view name) const { return s_->entry(name).info; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(s_->by_offset.size());
  for (size_t i : s_->by_offset) out.push_back(s_->entries[i].name);
  return out;
}

std::vector<std::string> SafetensorsFile::header_names() const {
  std::vector<std::string> out;
  out.reserve(s_->entries.size());
  for (const State::Entry& e : s_->entries) out.push_back(e.name);
  return out;
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo& info = s_->entry(name).info;
  uint8_t* p = const_cast<uint8_t*>(s_->bytes) + data_offset() + info.begin;
  if (info.nbytes() != 0 && reinterpret_cast<uintptr_t>(p) % dtype_size(info.dtype) != 0) {
    Tensor t = Tensor::empty(info.shape, info.dtype, Device::cpu(), MemCategory::workspace);
    std::memcpy(t.data_ptr(), p, info.nbytes());
    return t;
  }
  return Tensor::wrap(p, info.shape, info.dtype);
}

std::vector<std::pair<std::string, Tensor>> SafetensorsFile::tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(s_->by_offset.size());
  for (size_t i : s_->by_offset) out.emplace_back(s_->entries[i].name, tensor(s_->entries[i].name));
  return out;
}

SafetensorsWriteOptions SafetensorsFile::layout() const {
  SafetensorsWriteOptions o;
  bool header_is_data_order = true;
  for (size_t i = 0; i < s_->by_offset.size(); ++i) header_is_data_order &= s_->by_offset[i] == i;
  if (!header_is_data_order) o.header_order = header_names();
  o.metadata_order = s_->metadata_order;
  o.write_empty_metadata = s_->has_metadata && s_->metadata.empty();
  return o;
}

bool SafetensorsFile::canonical() const {
  std::vector<HeaderItem> items;
  items.reserve(s_->entries.size());
  for (const State::Entry& e : s_->entries)
    items.push_back(HeaderItem{e.name, e.info.dtype, &e.info.shape, e.info.begin, e.info.end});
  MetaList meta;
  for (const std::string& k : s_->metadata_order) meta.emplace_back(k, s_->metadata.at(k));
  const std::string h = render_header(items, meta, s_->has_metadata);
  return h.size() == s_->header_len && std::memcmp(h.data(), s_->bytes + 8, h.size()) == 0;
}

// --- writer ------------------------------------------------------------------------

namespace {

struct WritePlan {
  std::string header;                   // padded
  std::vector<const Tensor*> data;      // data order
};

WritePlan plan_write(const std::string& where, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata, const SafetensorsWriteOptions& opt) {
  std::map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    ZT_CHECK(valid_utf8(name), where, ": tensor name ", quote(name), " is not valid UTF-8");
    ZT_CHECK(name != "__metadata__", where, ": \"__metadata__\" is reserved and cannot name a tensor");
    ZT_CHECK(by_name.emplace(name, i).second, where, ": two tensors are named ", quote(name));
    ZT_CHECK(t.defined(), where, ": tensor ", quote(name), " is undefined");
    ZT_CHECK(t.device().is_cpu(), where, ": tensor ", quote(name), " is ", t.str(),
             "; safetensors are written from CPU tensors (copy it to the CPU first)");
  }
  for (const auto& [k, v] : metadata) {
    ZT_CHECK(valid_utf8(k), where, ": metadata key ", quote(k), " is not valid UTF-8");
    ZT_CHECK(valid_utf8(v), where, ": metadata value of ", quote(k), " is not valid UTF-8");
  }

  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (opt.hf_layout) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const int ra = dtype_entry(tensors[a].second.dtype()).hf_rank;
      const int rb = dtype_entry(tensors[b].second.dtype()).hf_rank;
      return ra != rb ? ra > rb : tensors[a].first < tensors[b].first;  // std::string: bytewise
    });
  }
  std::vector<uint64_t> begin(tensors.size()), end(tensors.size());
  uint64_t pos = 0;
  WritePlan plan;
  for (size_t i : order) {
    begin[i] = pos;
    pos += tensors[i].second.nbytes();
    end[i] = pos;
    plan.data.push_back(&tensors[i].second);
  }

  std::vector<size_t> header_order = order;
  if (!opt.header_order.empty()) {
    ZT_CHECK(opt.header_order.size() == tensors.size(), where, ": header_order lists ", opt.header_order.size(),
             " names for ", tensors.size(), " tensors");
    std::vector<bool> used(tensors.size(), false);
    for (size_t j = 0; j < opt.header_order.size(); ++j) {
      const auto it = by_name.find(opt.header_order[j]);
      ZT_CHECK(it != by_name.end(), where, ": header_order names ", quote(opt.header_order[j]),
               ", which is not one of the tensors");
      ZT_CHECK(!used[it->second], where, ": header_order names ", quote(opt.header_order[j]), " twice");
      used[it->second] = true;
      header_order[j] = it->second;
    }
  }

  MetaList meta;
  std::unordered_set<std::string_view> placed;
  for (const std::string& k : opt.metadata_order) {
    const auto it = metadata.find(k);
    ZT_CHECK(it != metadata.end(), where, ": metadata_order names ", quote(k), ", which is not a metadata key");
    ZT_CHECK(placed.insert(k).second, where, ": metadata_order names ", quote(k), " twice");
    meta.emplace_back(it->first, it->second);
  }
  for (const auto& [k, v] : metadata)
    if (!placed.count(k)) meta.emplace_back(k, v);

  std::vector<HeaderItem> items;
  items.reserve(tensors.size());
  for (size_t i : header_order) {
    const auto& [name, t] = tensors[i];
    items.push_back(HeaderItem{name, t.dtype(), &t.shape(), begin[i], end[i]});
  }
  plan.header = render_header(items, meta, !metadata.empty() || opt.write_empty_metadata);
  ZT_CHECK(plan.header.size() <= kSafetensorsMaxHeaderBytes, where, ": the header would be ", plan.header.size(),
           " bytes, more than the format's limit of ", kSafetensorsMaxHeaderBytes);
  return plan;
}


}  // namespace

std::vector<uint8_t> safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                                       const SafetensorsWriteOptions& options) {
  const WritePlan plan = plan_write("safetensors_bytes", tensors, metadata, options);
  size_t total = 8 + plan.header.size();
  for (const Tensor* t : plan.data) total += t->nbytes();
  std::vector<uint8_t> out(total);
  const uint64_t n = plan.header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, plan.header.data(), plan.header.size());
  size_t pos = 8 + plan.header.size();
  for (const Tensor* t : plan.data) {
    if (t->nbytes()) std::memcpy(out.data() + pos, t->data_ptr(), t->nbytes());
    pos += t->nbytes();
  }
  return out;
}

FileDigest write_safetensors(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata,
                             const SafetensorsWriteOptions& options) {
  const WritePlan plan = plan_write(path, tensors, metadata, options);
  DurableWriter out(path);
  const uint64_t n = plan.header.size();
  out.write(&n, 8);
  out.write(plan.header.data(), plan.header.size());
  for (const Tensor* t : plan.data)
    if (t->nbytes()) out.write(t->data_ptr(), t->nbytes());
  out.commit();
  return FileDigest{out.bytes(), out.checksum()};
}

}  // namespace zt::ckpt
