// safetensors reader/writer: round trips, exact bytes, a file from an
// independent Python writer, one hand-built corrupt file per validation rule,
// and randomized corruption (parse must succeed or throw zt::Error).
#include "ckpt/safetensors.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace zt::ckpt {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr DType kAllDTypes[] = {
#define ZT_X(id, type, bytes, name, fl) DType::id,
    ZT_DTYPES(ZT_X)
#undef ZT_X
};

// ---------------------------------------------------------------------------
// helpers

template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void append_le64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

// 8-byte length + header + `data` bytes (0x00, 0x01, ...). With pad, the
// header is padded with spaces to a multiple of 8 like writers do.
Bytes build(std::string header, size_t data = 0, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  Bytes b;
  append_le64(b, header.size());
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data; ++i) b.push_back(uint8_t(i));
  return b;
}

// The message of parse()'s zt::Error, or "" if the bytes were accepted. The
// bytes are copied into an exactly-sized heap block so ASan sees overreads.
std::string parse_error(const Bytes& b, const std::string& name = "bad.safetensors") {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[b.size()]);
  if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
  return error_of([&] { SafetensorsFile::parse({copy.get(), b.size()}, name); });
}

Tensor random_bytes_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng());
  return t;
}

::testing::AssertionResult same_tensor(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << "got " << got.str() << ", want " << want.str();
  if (got.nbytes() && std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes of " << got.str() << " differ";
  return ::testing::AssertionSuccess();
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

Bytes bytes_of(std::initializer_list<int> v) {
  Bytes b;
  for (int x : v) b.push_back(uint8_t(x));
  return b;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "zt_ckpt_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
};

// ---------------------------------------------------------------------------
// dtype names

TEST(SafetensorsDType, NamesRoundTrip) {
  for (DType t : kAllDTypes) {
    const std::string_view name = safetensors_dtype_name(t);
    ASSERT_EQ(dtype_from_safetensors(name), t) << name;
  }
  EXPECT_EQ(safetensors_dtype_name(DType::f32), "F32");
  EXPECT_EQ(safetensors_dtype_name(DType::bf16), "BF16");
  EXPECT_EQ(safetensors_dtype_name(DType::f16), "F16");
  EXPECT_EQ(safetensors_dtype_name(DType::f8e4m3), "F8_E4M3");
  EXPECT_EQ(safetensors_dtype_name(DType::f8e5m2), "F8_E5M2");
  EXPECT_EQ(safetensors_dtype_name(DType::i32), "I32");
  EXPECT_EQ(safetensors_dtype_name(DType::i64), "I64");
  EXPECT_EQ(safetensors_dtype_name(DType::u16), "U16");
  EXPECT_EQ(safetensors_dtype_name(DType::u32), "U32");
  for (const char* other : {"F64", "BOOL", "U8", "I8", "I16", "U64", "f32", "float32", ""})
    EXPECT_EQ(dtype_from_safetensors(other), std::nullopt) << other;
}

// ---------------------------------------------------------------------------
// round trips

TEST_F(SafetensorsTest, RoundTripEveryDTypeAndOddShapes) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(1);
  const Shape shapes[] = {Shape{}, Shape{0}, Shape{1}, Shape{7}, Shape{3, 5}, Shape{0, 4}, Shape{4, 0, 2},
                          Shape{1, 1, 1}, Shape{2, 3, 1, 5}, Shape{1, 2, 1, 2, 1, 2, 1, 2}};
  NamedTensors tensors;
  for (DType dt : kAllDTypes)
    for (size_t i = 0; i < std::size(shapes); ++i)
      tensors.emplace_back(std::string(dtype_name(dt)) + "." + std::to_string(i),
                           random_bytes_tensor(shapes[i], dt, rng));
  std::shuffle(tensors.begin(), tensors.end(), rng);
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "1200"}};

  for (bool hf : {false, true}) {
    SCOPED_TRACE(hf ? "hf_layout" : "given order");
    const std::string p = path(hf ? "hf.safetensors" : "given.safetensors");
    write_safetensors(p, tensors, meta, {.hf_layout = hf});
    EXPECT_FALSE(fs::exists(p + ".tmp"));
    const SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.path(), p);
    EXPECT_EQ(f.metadata(), meta);
    ASSERT_EQ(f.size(), tensors.size());
    EXPECT_EQ(f.file_size(), fs::file_size(p));
    EXPECT_EQ(f.data_offset() % 8, 0u);
    for (const auto& [name, want] : tensors) {
      ASSERT_TRUE(f.contains(name)) << name;
      const TensorInfo& info = f.info(name);
      EXPECT_EQ(info.dtype, want.dtype());
      EXPECT_EQ(info.shape, want.shape());
      EXPECT_EQ(info.nbytes(), want.nbytes());
      const Tensor got = f.tensor(name);
      EXPECT_TRUE(same_tensor(got, want)) << name;
      EXPECT_EQ(got.device(), Device::cpu());
      if (hf && want.nbytes()) {  // hf_layout aligns every tensor: a view of the mapping, not a copy
        EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data_ptr()) % dtype_size(want.dtype()), 0u) << name;
        EXPECT_EQ(got.data_ptr(), f.tensor(name).data_ptr()) << name;
      }
    }
    // Data order: the given order, or (dtype rank desc, name).
    std::vector<std::string> want_names;
    for (const auto& [name, t] : tensors) want_names.push_back(name);
    if (hf) {
      auto rank = [](DType d) {
        const DType order[] = {DType::i64, DType::f32, DType::u32, DType::i32,    DType::bf16,
                               DType::f16, DType::u16, DType::f8e4m3, DType::f8e5m2};
        return std::find(std::begin(order), std::end(order), d) - std::begin(order);
      };
      std::map<std::string, DType> dt;
      for (const auto& [name, t] : tensors) dt[name] = t.dtype();
      std::sort(want_names.begin(), want_names.end(), [&](const std::string& a, const std::string& b) {
        return rank(dt[a]) != rank(dt[b]) ? rank(dt[a]) < rank(dt[b]) : a < b;
      });
    }
    EXPECT_EQ(f.names(), want_names);
    EXPECT_EQ(f.header_names(), want_names);
    EXPECT_TRUE(f.canonical());

    // Reading and writing again gives the same bytes.
    write_safetensors(path("again.safetensors"), f.tensors(), f.metadata(), f.layout());
    EXPECT_EQ(read_file(path("again.safetensors")), read_file(p));
    EXPECT_EQ(safetensors_bytes(f.tensors(), f.metadata(), f.layout()), read_file(p));
    EXPECT_EQ(safetensors_bytes(tensors, meta, {.hf_layout = hf}), read_file(p));
  }
}

TEST_F(SafetensorsTest, EmptyFileAndEmptyMetadata) {
  const std::string p = path("empty.safetensors");
  write_safetensors(p, {});
  const Bytes want = bytes_of({8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '});
  EXPECT_EQ(read_file(p), want);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.size(), 0u);
  EXPECT_TRUE(f.names().empty());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.canonical());
  EXPECT_FALSE(f.layout().write_empty_metadata);

  // "__metadata__":{} is kept through a round trip when asked for.
  const Bytes with_meta = safetensors_bytes({}, {}, {.write_empty_metadata = true});
  EXPECT_EQ(std::string(with_meta.begin() + 8, with_meta.end()), "{\"__metadata__\":{}}     ");
  const SafetensorsFile g = SafetensorsFile::parse(with_meta, "m");
  EXPECT_TRUE(g.layout().write_empty_metadata);
  EXPECT_EQ(safetensors_bytes({}, g.metadata(), g.layout()), with_meta);
}

TEST_F(SafetensorsTest, MetadataOrderAndEscapes) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(2);
  const std::map<std::string, std::string> meta{
      {"format", "pt"}, {"b \"quoted\"", "back\\slash\n\t\x01"}, {"\xc3\xa9t\xc3\xa9", "\xe2\x82\xac 1"}, {"", ""}};
  const NamedTensors tensors{{"x", random_bytes_tensor(Shape{3}, DType::f32, rng)}};
  // Keys in an explicit order, the rest sorted after them.
  const Bytes b = safetensors_bytes(tensors, meta, {.metadata_order = {"format", "\xc3\xa9t\xc3\xa9"}});
  const std::string header(b.begin() + 8, b.end() - 12);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            "{\"__metadata__\":{\"format\":\"pt\",\"\xc3\xa9t\xc3\xa9\":\"\xe2\x82\xac 1\",\"\":\"\","
            "\"b \\\"quoted\\\"\":\"back\\\\slash\\n\\t\\u0001\"},"
            "\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}");
  const SafetensorsFile f = SafetensorsFile::parse(b, "meta");
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_TRUE(f.canonical());
  EXPECT_EQ((f.layout().metadata_order),
            (std::vector<std::string>{"format", "\xc3\xa9t\xc3\xa9", "", "b \"quoted\""}));
  EXPECT_EQ(safetensors_bytes(f.tensors(), f.metadata(), f.layout()), b);
}

TEST_F(SafetensorsTest, ExactBytesOfASmallFile) {
  // Built by hand from the format description: f32 (2) = {1, -2}, i64
  // scalar 7, bf16 (0, 3) empty, metadata format=pt.
  Tensor w = Tensor::empty(Shape{2}, DType::f32);
  w.data<float>()[0] = 1.0f;
  w.data<float>()[1] = -2.0f;
  Tensor n = Tensor::empty(Shape{}, DType::i64);
  n.data<int64_t>()[0] = 7;
  Tensor e = Tensor::empty(Shape{0, 3}, DType::bf16);
  const NamedTensors tensors{{"w", w}, {"n", n}, {"e", e}};

  const std::string h1 =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]},"
      "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[16,16]}}"
      "    ";  // 196 bytes of JSON + 4 spaces = 200
  Bytes want = bytes_of({200, 0, 0, 0, 0, 0, 0, 0});
  want.insert(want.end(), h1.begin(), h1.end());
  for (int x : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 7, 0, 0, 0, 0, 0, 0, 0}) want.push_back(uint8_t(x));
  ASSERT_EQ(h1.size(), 200u);
  const std::string p = path("small.safetensors");
  write_safetensors(p, tensors, {{"format", "pt"}});
  EXPECT_EQ(read_file(p), want);

  // hf_layout, no metadata: I64 first, then F32, then BF16.
  const std::string h2 =
      "{\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[16,16]}}"
      "   ";  // 165 + 3 = 168
  Bytes want2 = bytes_of({168, 0, 0, 0, 0, 0, 0, 0});
  want2.insert(want2.end(), h2.begin(), h2.end());
  for (int x : {7, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}) want2.push_back(uint8_t(x));
  ASSERT_EQ(h2.size(), 168u);
  EXPECT_EQ(safetensors_bytes(tensors, {}, {.hf_layout = true}), want2);

  // And the reader sees exactly those values.
  const SafetensorsFile f = SafetensorsFile::parse(want, "small");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"w", "n", "e"}));
  EXPECT_EQ(f.tensor("w").data<float>()[1], -2.0f);
  EXPECT_EQ(f.tensor("n").data<int64_t>()[0], 7);
  EXPECT_EQ(f.info("e").begin, 16u);
  EXPECT_EQ(f.info("e").end, 16u);
  EXPECT_EQ(f.tensor("e").shape(), (Shape{0, 3}));
  // A view into the caller's bytes, not a copy.
  EXPECT_EQ(f.tensor("w").data_ptr(), static_cast<const void*>(want.data() + 8 + 200));
}

TEST_F(SafetensorsTest, NameEscapesMatchSerdeJson) {
  Tensor t = Tensor::empty(Shape{1}, DType::u16);
  t.data<uint16_t>()[0] = 0xBEEF;
  const std::string name = "a\"b\\c\nd\x01\x1f/\x7f\xc3\xa9\xf0\x9f\x98\x80";
  const Bytes b = safetensors_bytes({{name, t}});
  const std::string header(b.begin() + 8, b.end() - 2);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            "{\"a\\\"b\\\\c\\nd\\u0001\\u001f/\x7f\xc3\xa9\xf0\x9f\x98\x80\":"
            "{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[0,2]}}");
  const SafetensorsFile f = SafetensorsFile::parse(b, "esc");
  EXPECT_EQ(f.names(), std::vector<std::string>{name});
  EXPECT_EQ(f.tensor(name).data<uint16_t>()[0], 0xBEEF);
  EXPECT_TRUE(f.canonical());
}

// A file written by an independent writer (tests/reference/write_safetensors.py,
// Python standard library only, laid out like Python's safetensors package).
TEST_F(SafetensorsTest, ReadsFileFromIndependentPythonWriter) {
  ZT_TEST_TRACE_SEED();
  const std::string python = "/usr/bin/python3";
  const std::string script = std::string(ZT_SOURCE_DIR) + "/tests/reference/write_safetensors.py";
  if (::access(python.c_str(), X_OK) != 0) GTEST_SKIP() << python << " not found; cannot run " << script;
  auto rng = test::make_rng(3);

  // Names chosen so that bytewise order matters ("B" < "a" < "z" < "é").
  const std::vector<std::pair<std::string, std::pair<Shape, DType>>> spec_tensors = {
      {"z.weight", {Shape{3, 4}, DType::f32}},     {"a.weight", {Shape{5}, DType::f32}},
      {"B", {Shape{2, 3}, DType::bf16}},           {"\xc3\xa9mb", {Shape{7}, DType::f16}},
      {"ids", {Shape{4}, DType::i64}},             {"scalar", {Shape{}, DType::i32}},
      {"empty", {Shape{0, 9}, DType::f32}},        {"q\"uote\n", {Shape{3}, DType::f8e4m3}},
      {"f8b", {Shape{5}, DType::f8e5m2}},          {"u16", {Shape{3}, DType::u16}},
      {"u32", {Shape{2, 2}, DType::u32}},          {"odd", {Shape{1, 1, 3}, DType::f8e4m3}},
  };
  NamedTensors tensors;
  nlohmann::json spec;
  spec["metadata"] = {{"format", "pt"}};
  spec["tensors"] = nlohmann::json::array();
  for (const auto& [name, sd] : spec_tensors) {
    Tensor t = random_bytes_tensor(sd.first, sd.second, rng);
    std::string hex;
    char buf[3];
    for (size_t i = 0; i < t.nbytes(); ++i) {
      std::snprintf(buf, sizeof buf, "%02x", static_cast<const uint8_t*>(t.data_ptr())[i]);
      hex += buf;
    }
    spec["tensors"].push_back({{"name", name},
                               {"dtype", std::string(safetensors_dtype_name(sd.second))},
                               {"shape", std::vector<int64_t>(sd.first.begin(), sd.first.end())},
                               {"hex", hex}});
    tensors.emplace_back(name, t);
  }
  const std::string spec_path = path("spec.json"), out = path("py.safetensors");
  std::ofstream(spec_path) << spec.dump();
  const std::string cmd = python + " " + script + " " + spec_path + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(f.size(), tensors.size());
  for (const auto& [name, want] : tensors) EXPECT_TRUE(same_tensor(f.tensor(name), want)) << name;
  EXPECT_EQ(f.names().front(), "ids");  // I64 first
  EXPECT_EQ(f.names().back(), "f8b");   // F8_E5M2 last
  EXPECT_TRUE(f.canonical());
  // Our hf_layout writer produces the same bytes as the reference writer.
  EXPECT_EQ(safetensors_bytes(tensors, {{"format", "pt"}}, {.hf_layout = true}), read_file(out));
  EXPECT_EQ(safetensors_bytes(f.tensors(), f.metadata(), f.layout()), read_file(out));
}

// ---------------------------------------------------------------------------
// files that are valid but not written by us

TEST_F(SafetensorsTest, AcceptsNonCanonicalHeadersAndPreservesTheirOrder) {
  // Keys within an entry reordered, "__metadata__" in the middle, "-0", JSON
  // whitespace, extra padding: valid, but not what a writer of ours produces.
  const Bytes b = build(
      "{ \"b\": {\"shape\": [2], \"dtype\": \"I32\", \"data_offsets\": [0, 8]},\n"
      "  \"__metadata__\": {\"k\": \"v\"},\n"
      "  \"a\": {\"data_offsets\": [8, 8], \"dtype\": \"F32\", \"shape\": [1, -0]} }\n            ",
      8);
  const SafetensorsFile f = SafetensorsFile::parse(b, "pretty");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(f.header_names(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(f.info("a").shape, (Shape{1, 0}));
  EXPECT_EQ(f.tensor("b").data<int32_t>()[1], 0x07060504);
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_FALSE(f.canonical());

  // Compact but with the header listing tensors in another order than the
  // data: layout() reproduces it byte for byte.
  const Bytes c = build(
      "{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
      "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      8);
  const SafetensorsFile g = SafetensorsFile::parse(c, "reordered");
  EXPECT_EQ(g.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(g.header_names(), (std::vector<std::string>{"y", "x"}));
  EXPECT_TRUE(g.canonical());
  EXPECT_EQ(g.layout().header_order, (std::vector<std::string>{"y", "x"}));
  EXPECT_EQ(safetensors_bytes(g.tensors(), g.metadata(), g.layout()), c);

  // Rewriting a non-canonical file gives a canonical one with the same contents.
  const Bytes r = safetensors_bytes(f.tensors(), f.metadata(), f.layout());
  const SafetensorsFile h = SafetensorsFile::parse(r, "rewritten");
  EXPECT_TRUE(h.canonical());
  EXPECT_EQ(h.metadata(), f.metadata());
  for (const std::string& n : f.names()) EXPECT_TRUE(same_tensor(h.tensor(n), f.tensor(n)));
}

TEST_F(SafetensorsTest, MisalignedDataIsCopiedAndAlignedDataIsViewed) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(4);
  // Given order puts an f32 at byte 3 of the data area (our writer keeps
  // the order it is given; hf_layout would align it).
  const NamedTensors tensors{{"f8", random_bytes_tensor(Shape{3}, DType::f8e4m3, rng)},
                             {"f32", random_bytes_tensor(Shape{2, 2}, DType::f32, rng)}};
  const std::string p = path("misaligned.safetensors");
  write_safetensors(p, tensors);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.info("f32").begin, 3u);
  const Tensor a = f.tensor("f32");
  EXPECT_TRUE(same_tensor(a, tensors[1].second));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 4, 0u);
  EXPECT_NE(a.data_ptr(), f.tensor("f32").data_ptr());  // a private copy each time
  EXPECT_EQ(f.tensor("f8").data_ptr(), f.tensor("f8").data_ptr());  // a view
  EXPECT_TRUE(same_tensor(f.tensor("f8"), tensors[0].second));
}

TEST_F(SafetensorsTest, ViewsAreCopyOnWriteAndRewritesAreAtomic) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(5);
  const std::string p = path("model.safetensors");
  const Tensor orig = random_bytes_tensor(Shape{16}, DType::f32, rng);
  write_safetensors(p, {{"w", orig}});
  const Bytes on_disk = read_file(p);

  SafetensorsFile f = SafetensorsFile::open(p);
  Tensor v = f.tensor("w");
  v.data<float>()[0] = 12345.0f;  // private to this process
  EXPECT_EQ(read_file(p), on_disk);
  EXPECT_EQ(SafetensorsFile::open(p).tensor("w").data<float>()[1], orig.data<float>()[1]);

  // Overwrite the file we are reading from, with data taken from its views.
  const Tensor other = random_bytes_tensor(Shape{16}, DType::f32, rng);
  write_safetensors(p, {{"w", other}, {"old", f.tensor("w")}});
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(v.data<float>()[0], 12345.0f);  // the old mapping is untouched by the rename
  EXPECT_TRUE(same_tensor(f.tensor("w").view(Shape{16}), v));
  const SafetensorsFile g = SafetensorsFile::open(p);
  EXPECT_TRUE(same_tensor(g.tensor("w"), other));
  EXPECT_EQ(g.tensor("old").data<float>()[0], 12345.0f);

  // Copies share the mapping: views stay valid while any copy lives.
  Tensor w2;
  std::optional<SafetensorsFile> keep;
  {
    const SafetensorsFile h = SafetensorsFile::open(p);
    keep = h;
    w2 = h.tensor("w");
  }
  EXPECT_TRUE(same_tensor(w2, other));
}

// ---------------------------------------------------------------------------
// errors from open() and the writer

TEST_F(SafetensorsTest, OpenErrorsNameThePath) {
  const std::string missing = path("missing.safetensors");
  std::string msg = error_of([&] { SafetensorsFile::open(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;

  msg = error_of([&] { SafetensorsFile::open(dir_); });
  EXPECT_NE(msg.find(dir_ + ": not a regular file"), std::string::npos) << msg;

  const std::string tiny = path("tiny.safetensors");
  write_file(tiny, bytes_of({1, 2, 3}));
  msg = error_of([&] { SafetensorsFile::open(tiny); });
  EXPECT_NE(msg.find(tiny + ": the file is 3 bytes, too short"), std::string::npos) << msg;

  const std::string empty = path("empty.safetensors");
  write_file(empty, {});
  msg = error_of([&] { SafetensorsFile::open(empty); });
  EXPECT_NE(msg.find(empty + ": the file is 0 bytes"), std::string::npos) << msg;

  // Validation errors from a real file carry its path too.
  const std::string bad = path("bad.safetensors");
  write_file(bad, build("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8));
  msg = error_of([&] { SafetensorsFile::open(bad); });
  EXPECT_NE(msg.find(bad + ": tensor 'a' has dtype 'F64', which Zettatron does not support"), std::string::npos)
      << msg;

  const SafetensorsFile f = SafetensorsFile::parse(build("{}"), "x.safetensors");
  msg = error_of([&] { f.info("nope"); });
  EXPECT_NE(msg.find("x.safetensors: no tensor named 'nope'"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { f.tensor("nope"); }).find("no tensor named 'nope'"), std::string::npos);
  EXPECT_FALSE(f.contains("nope"));
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  Tensor t = Tensor::empty(Shape{2}, DType::f32);
  t.data<float>()[0] = t.data<float>()[1] = 0.0f;
  const std::string p = path("w.safetensors");
  auto expect_error = [&](const NamedTensors& ts, const std::map<std::string, std::string>& meta,
                          const SafetensorsWriteOptions& opt, const std::string& what) {
    const std::string msg = error_of([&] { write_safetensors(p, ts, meta, opt); });
    EXPECT_NE(msg.find(p + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  };
  expect_error({{"a", t}, {"a", t}}, {}, {}, "two tensors are named 'a'");
  expect_error({{"__metadata__", t}}, {}, {}, "\"__metadata__\" is reserved");
  expect_error({{"bad\xff", t}}, {}, {}, "is not valid UTF-8");
  expect_error({{"surrogate\xed\xa0\x80", t}}, {}, {}, "is not valid UTF-8");
  expect_error({{"overlong\xc0\xaf", t}}, {}, {}, "is not valid UTF-8");
  expect_error({{"a", t}}, {{"k", "\x80"}}, {}, "metadata value of 'k' is not valid UTF-8");
  expect_error({{"a", Tensor()}}, {}, {}, "tensor 'a' is undefined");
  float fake[2];
  expect_error({{"g", Tensor::wrap(fake, Shape{2}, DType::f32, Device::cuda(0))}}, {}, {},
               "tensor 'g' is f32(2) on cuda:0; safetensors are written from CPU tensors");
  expect_error({{"a", t}, {"b", t}}, {}, {.header_order = {"a"}}, "header_order lists 1 names for 2 tensors");
  expect_error({{"a", t}, {"b", t}}, {}, {.header_order = {"a", "a"}}, "header_order names 'a' twice");
  expect_error({{"a", t}, {"b", t}}, {}, {.header_order = {"a", "c"}}, "'c', which is not one of the tensors");
  expect_error({{"a", t}}, {{"k", "v"}}, {.metadata_order = {"x"}}, "metadata_order names 'x', which is not");
  expect_error({{"a", t}}, {{"k", "v"}}, {.metadata_order = {"k", "k"}}, "metadata_order names 'k' twice");

  // An unwritable destination.
  const std::string nodir = path("no/such/dir/w.safetensors");
  const std::string msg = error_of([&] { write_safetensors(nodir, {{"a", t}}); });
  EXPECT_NE(msg.find(nodir + ": cannot create " + nodir + ".tmp"), std::string::npos) << msg;

  // The same tensor may be stored under two names (each gets its own bytes).
  write_safetensors(p, {{"a", t}, {"b", t}});
  EXPECT_EQ(SafetensorsFile::open(p).info("b").begin, 8u);
}

// ---------------------------------------------------------------------------
// one hand-built corrupt file per validation rule

struct BadCase {
  const char* name;
  Bytes bytes;
  std::string expect;  // substring of the message (after "bad.safetensors: ")
};

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> v;
  auto add = [&](const char* name, Bytes b, std::string expect) { v.push_back({name, std::move(b), expect}); };
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offs) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offs + "}";
  };
  const std::string a8 = entry("a", "F32", "[2]", "[0,8]");

  add("TooShortForLength", bytes_of({16, 0, 0}), "the file is 3 bytes, too short for the 8-byte header length");
  {
    Bytes b;
    append_le64(b, 1000);
    for (char c : std::string("{}        ")) b.push_back(uint8_t(c));
    add("HeaderLongerThanFile", b, "header length 1000 exceeds the 10 bytes that follow the length field");
  }
  {
    Bytes b;
    append_le64(b, uint64_t(1) << 63);
    for (char c : std::string("{}      ")) b.push_back(uint8_t(c));
    add("HeaderLengthHuge", b, "header length 9223372036854775808 exceeds the limit of 100000000 bytes");
  }
  {
    Bytes b;
    append_le64(b, 100'000'001);
    add("HeaderJustOverLimit", b, "exceeds the limit of 100000000 bytes");
  }
  add("HeaderEmpty", bytes_of({0, 0, 0, 0, 0, 0, 0, 0}), "the header is not a JSON object");
  add("NotAnObject", build("[1,2,3]"), "the header is not a JSON object");
  add("Utf8Bom", build("\xef\xbb\xbf{}"), "the header is not a JSON object");
  add("BadJsonTruncated", build("{\"a\":{\"dtype\":\"F32\","), "the header is not valid JSON");
  add("BadJsonTrailingGarbage", build("{} x"), "the header is not valid JSON");
  add("BadJsonSecondObject", build("{}{}"), "the header is not valid JSON");
  add("BadJsonInvalidUtf8", build("{\"\xff\":{}}"), "the header is not valid JSON");
  add("BadJsonRawControlChar", build("{\"a\nb\":{}}"), "the header is not valid JSON");
  add("BadJsonPaddedWithNul", build(std::string("{}\0\0\0\0\0\0", 8), 0, false), "the header is not valid JSON");
  add("BadJsonNulThenGarbage", build(std::string("{}\0garbage", 10)), "it contains a NUL byte at offset 2");
  add("EntryNotObject", build("{\"a\":5}"), "tensor 'a' is a number, not an object");
  add("EntryIsArray", build("{\"a\":[0,8]}"), "tensor 'a' is an array, not an object");
  add("MetadataNotObject", build("{\"__metadata__\":\"x\"}"), "\"__metadata__\" is a string, not an object");
  add("MetadataValueNumber", build("{\"__metadata__\":{\"k\":1}}"),
      "__metadata__ value of 'k' is a number; metadata values must be strings");
  add("MetadataValueObject", build("{\"__metadata__\":{\"k\":{}}}"),
      "__metadata__ value of 'k' is an object; metadata values must be strings");
  add("MetadataValueNull", build("{\"__metadata__\":{\"k\":null}}"), "value of 'k' is null;");
  add("UnknownDType", build("{" + entry("a", "F33", "[2]", "[0,8]") + "}", 8),
      "tensor 'a' has dtype 'F33', which is not a safetensors dtype (supported: ");
  add("UnsupportedDTypeF64", build("{" + entry("a", "F64", "[1]", "[0,8]") + "}", 8),
      "tensor 'a' has dtype 'F64', which Zettatron does not support (supported: F8_E5M2");
  add("UnsupportedDTypeBool", build("{" + entry("m", "BOOL", "[4]", "[0,4]") + "}", 4),
      "tensor 'm' has dtype 'BOOL', which Zettatron does not support");
  add("DTypeNotString", build("{\"a\":{\"dtype\":4,\"shape\":[],\"data_offsets\":[0,4]}}", 4),
      "tensor 'a': 'dtype' is a number, not a string");
  add("NegativeShape", build("{" + entry("a", "F32", "[-1,2]", "[0,8]") + "}", 8),
      "tensor 'a': 'shape' contains the negative value -1");
  add("FloatShape", build("{" + entry("a", "F32", "[2.0]", "[0,8]") + "}", 8),
      "tensor 'a': 'shape' contains '2.0', which is not a non-negative 64-bit integer");
  add("ExponentShape", build("{" + entry("a", "F32", "[2e0]", "[0,8]") + "}", 8), "contains '2e0', which is not");
  add("ShapeBeyondUint64", build("{" + entry("a", "F32", "[18446744073709551616]", "[0,8]") + "}", 8),
      "contains '18446744073709551616', which is not a non-negative 64-bit integer");
  add("ShapeNotArray", build("{" + entry("a", "F32", "2", "[0,8]") + "}", 8),
      "tensor 'a': 'shape' is a number, not an array of non-negative integers");
  add("ShapeHoldsString", build("{" + entry("a", "F32", "[\"2\"]", "[0,8]") + "}", 8),
      "tensor 'a': 'shape' contains a string; only non-negative integers are allowed");
  add("ShapeNested", build("{" + entry("a", "F32", "[[2]]", "[0,8]") + "}", 8),
      "tensor 'a': 'shape' contains an array");
  add("ShapeTooManyDims", build("{" + entry("a", "F32", "[1,1,1,1,1,1,1,1,2]", "[0,8]") + "}", 8),
      "tensor 'a' has more than 8 dimensions");
  add("ShapeDimTooLarge", build("{" + entry("a", "F32", "[9223372036854775808]", "[0,8]") + "}", 8),
      "has the dimension 9223372036854775808, which is too large");
  add("ShapeProductOverflow", build("{" + entry("a", "F32", "[1099511627776,1099511627776]", "[0,8]") + "}", 8),
      "tensor 'a' has shape (1099511627776, 1099511627776), whose element count overflows 64 bits");
  add("ByteSizeOverflow", build("{" + entry("a", "F32", "[4611686018427387904]", "[0,8]") + "}", 8),
      "tensor 'a' has shape (4611686018427387904) x f32, whose byte size overflows 64 bits");
  add("MissingDataOffsets", build("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8), "tensor 'a' has no 'data_offsets'");
  add("MissingDType", build("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8), "tensor 'a' has no 'dtype'");
  add("UnknownKey", build("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"offsets\":[0,8]}}", 8),
      "tensor 'a' has the unknown key 'offsets' (allowed: dtype, shape, data_offsets)");
  add("DuplicateKeyInEntry", build("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
      "tensor 'a' has the key 'dtype' twice");
  add("DuplicateTensorName", build("{" + a8 + "," + entry("a", "F32", "[2]", "[8,16]") + "}", 16),
      "tensor 'a' appears twice");
  add("DuplicateMetadata", build("{\"__metadata__\":{},\"__metadata__\":{}}"), "\"__metadata__\" appears twice");
  add("DuplicateMetadataKey", build("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}"), "__metadata__ has the key 'k' twice");
  add("OffsetsThreeValues", build("{" + entry("a", "F32", "[2]", "[0,8,8]") + "}", 8),
      "tensor 'a': 'data_offsets' must hold 2 integers [begin, end], not more");
  add("OffsetsOneValue", build("{" + entry("a", "F32", "[2]", "[8]") + "}", 8),
      "tensor 'a': 'data_offsets' must hold 2 integers [begin, end], not 1");
  add("OffsetsNegative", build("{" + entry("a", "F32", "[2]", "[-8,0]") + "}", 8),
      "'data_offsets' contains the negative value -8");
  add("BeginAfterEnd", build("{" + entry("a", "F32", "[0]", "[8,0]") + "}", 8),
      "tensor 'a' data_offsets [8, 0) have begin > end");
  add("ByteSizeMismatch", build("{" + entry("wte", "F32", "[10,20]", "[0,100]") + "}", 100),
      "tensor 'wte' data_offsets [0, 100) do not match shape (10, 20) x f32 = 800 bytes");
  add("OffsetsOutOfRange", build("{" + entry("a", "F32", "[2]", "[8,16]") + "}", 8),
      "tensor 'a' data_offsets [8, 16) lie outside the data area of 8 bytes (truncated file?)");
  add("OffsetsFarOutOfRange",
      build("{" + entry("a", "F32", "[2]", "[18446744073709551600,18446744073709551608]") + "}", 8),
      "lie outside the data area of 8 bytes");
  {
    Bytes b = build("{" + a8 + "," + entry("b", "I32", "[3]", "[8,20]") + "}", 20);
    b.resize(b.size() - 5);
    add("TruncatedData", b, "tensor 'b' data_offsets [8, 20) lie outside the data area of 15 bytes (truncated file?)");
  }
  add("Overlap", build("{" + a8 + "," + entry("b", "F32", "[2]", "[4,12]") + "}", 12),
      "tensor 'b' data_offsets [4, 12) overlap tensor 'a' [0, 8)");
  add("ZeroSizeInsideAnother", build("{" + a8 + "," + entry("z", "F32", "[0]", "[4,4]") + "}", 8),
      "tensor 'z' data_offsets [4, 4) overlap tensor 'a' [0, 8)");
  add("SameRangeTwice", build("{" + a8 + "," + entry("b", "F32", "[2]", "[0,8]") + "}", 8), "overlap tensor 'a' [0, 8)");
  add("Gap", build("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}", 12),
      "bytes [4, 8) of the data area belong to no tensor (a gap between 'a' and 'b')");
  add("GapAtStart", build("{" + entry("a", "F32", "[1]", "[4,8]") + "}", 8),
      "bytes [0, 4) of the data area belong to no tensor (a gap before 'a')");
  add("TrailingBytes", build("{" + entry("a", "F32", "[1]", "[0,4]") + "}", 8),
      "bytes [4, 8) at the end of the data area belong to no tensor (the last one, 'a', ends at 4)");
  add("DataWithoutTensors", build("{}", 3), "bytes [0, 3) at the end of the data area belong to no tensor (the "
                                            "header lists no tensors)");
  add("UglyNameIsQuoted", build("{\"a\\u0000\\n'\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}"),
      "tensor 'a\\x00\\x0a\\'' has dtype 'X'");
  return v;
}

class SafetensorsReject : public ::testing::TestWithParam<BadCase> {};

TEST_P(SafetensorsReject, WithMessageNamingFileAndProblem) {
  const BadCase& c = GetParam();
  const std::string msg = parse_error(c.bytes, "bad.safetensors");
  ASSERT_FALSE(msg.empty()) << c.name << " was accepted";
  EXPECT_EQ(msg.rfind("bad.safetensors: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in:\n" << msg;
}

INSTANTIATE_TEST_SUITE_P(Rules, SafetensorsReject, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

// The hand-built cases above differ from valid files only in the broken rule.
TEST(SafetensorsRejectControls, NearbyValidFilesAreAccepted) {
  const std::string a8 = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  EXPECT_EQ(parse_error(build("{" + a8 + "}", 8)), "");
  EXPECT_EQ(parse_error(build("{" + a8 + ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16)), "");
  EXPECT_EQ(parse_error(build("{" + a8 + ",\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", 8)), "");
  EXPECT_EQ(parse_error(build("{" + a8 + ",\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 8)), "");
  EXPECT_EQ(parse_error(build("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\"}}")), "");
  EXPECT_EQ(parse_error(build("{}")), "");
  EXPECT_EQ(parse_error(build("{}", 0, false)), "");  // no padding
  EXPECT_EQ(parse_error(build("{}\n\t\r ", 0, false)), "");  // JSON whitespace after the object
  EXPECT_EQ(parse_error(build("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8)), "");
  EXPECT_EQ(parse_error(build("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,0],\"data_offsets\":[0,0]}}")), "");
}

// The fuzz seed corpus (tests/ckpt/fuzz/make_corpus.py) is what its names say.
TEST(SafetensorsCorpus, SeedsAreValidOrInvalidAsNamed) {
  const fs::path dir = fs::path(ZT_SOURCE_DIR) / "tests/ckpt/fuzz/corpus";
  int valid = 0, bad = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string msg = parse_error(read_file(e.path().string()), name);
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_EQ(msg, "") << name;
      ++valid;
    } else {
      EXPECT_EQ(name.rfind("bad_", 0), 0u) << "corpus files are named valid_* or bad_*: " << name;
      EXPECT_EQ(msg.rfind(name + ": ", 0), 0u) << name << " was accepted or gave: " << msg;
      ++bad;
    }
  }
  EXPECT_GE(valid, 5);
  EXPECT_GE(bad, 5);
}

// ---------------------------------------------------------------------------
// randomized corruption: parse either succeeds or throws zt::Error

TEST(SafetensorsFuzz, RandomCorruptionNeverCrashes) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(6);
  NamedTensors tensors;
  tensors.emplace_back("wte", random_bytes_tensor(Shape{5, 3}, DType::bf16, rng));
  tensors.emplace_back("h.0.w", random_bytes_tensor(Shape{3, 2}, DType::f32, rng));
  tensors.emplace_back("ids", random_bytes_tensor(Shape{2}, DType::i64, rng));
  tensors.emplace_back("s", random_bytes_tensor(Shape{}, DType::u32, rng));
  tensors.emplace_back("e", random_bytes_tensor(Shape{0, 2}, DType::f16, rng));
  tensors.emplace_back("q", random_bytes_tensor(Shape{3}, DType::f8e5m2, rng));
  const Bytes base = safetensors_bytes(tensors, {{"format", "pt"}, {"note", "x"}}, {.hf_layout = true});
  uint64_t header_len;
  std::memcpy(&header_len, base.data(), 8);

  const std::string interesting = "{}[]\":,-.0123456789eE \\u";
  int accepted = 0, rejected = 0;
  const int iterations = 20000;
  for (int it = 0; it < iterations; ++it) {
    Bytes b = base;
    const int n_mut = 1 + int(rng() % 3);
    for (int m = 0; m < n_mut && !b.empty(); ++m) {
      auto pick = [&](size_t lo, size_t hi) { return hi > lo ? lo + size_t(rng() % (hi - lo)) : lo; };
      const size_t hdr_end = std::min(b.size(), size_t(8 + header_len));
      switch (rng() % 7) {
        case 0:  // flip a bit anywhere
          b[pick(0, b.size())] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1:  // a random byte anywhere
          b[pick(0, b.size())] = uint8_t(rng());
          break;
        case 2:  // truncate
          b.resize(pick(0, b.size()));
          break;
        case 3:  // a JSON-ish character in the header
          if (hdr_end > 8) b[pick(8, hdr_end)] = uint8_t(interesting[rng() % interesting.size()]);
          break;
        case 4: {  // another header length
          const uint64_t choices[] = {0, 1, header_len - 1, header_len + 1, header_len + 8, b.size(),
                                      b.size() - 8, 100'000'000, ~uint64_t(0), uint64_t(rng())};
          const uint64_t v = choices[rng() % std::size(choices)];
          if (b.size() >= 8) std::memcpy(b.data(), &v, 8);
          break;
        }
        case 5: {  // insert or delete a header byte, keeping the length field consistent
          if (hdr_end <= 9 || b.size() < 8) break;
          const size_t at = pick(8, hdr_end);
          uint64_t len;
          std::memcpy(&len, b.data(), 8);
          if (rng() % 2) {
            b.insert(b.begin() + std::ptrdiff_t(at), uint8_t(interesting[rng() % interesting.size()]));
            ++len;
          } else {
            b.erase(b.begin() + std::ptrdiff_t(at));
            --len;
          }
          std::memcpy(b.data(), &len, 8);
          break;
        }
        case 6: {  // change a digit of the header (offsets and shapes)
          std::vector<size_t> digits;
          for (size_t i = 8; i < hdr_end; ++i)
            if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
          if (!digits.empty()) b[digits[rng() % digits.size()]] = uint8_t('0' + rng() % 10);
          break;
        }
      }
    }
    std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(b.size(), 1)]);
    if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
    try {
      const SafetensorsFile f = SafetensorsFile::parse({copy.get(), b.size()}, "corrupt");
      ++accepted;
      // Touch every byte of every tensor (ASan checks they lie inside the buffer).
      unsigned sum = 0;
      for (const auto& [name, t] : f.tensors()) {
        const auto* p = static_cast<const uint8_t*>(t.data_ptr());
        for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
        ASSERT_EQ(t.nbytes(), f.info(name).nbytes());
      }
      (void)sum;
      if (f.canonical()) {
        ASSERT_EQ(safetensors_bytes(f.tensors(), f.metadata(), f.layout()), b) << "iteration " << it;
      }
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": parse threw something other than zt::Error: " << e.what();
    }
  }
  std::printf("random corruption: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 0);  // data-area mutations keep the file valid
  EXPECT_GT(rejected, iterations / 2);
}

}  // namespace
}  // namespace zt::ckpt
