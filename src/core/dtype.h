// DType: every element type Zettatron stores, declared once.
//
// ZT_DTYPES is the single table; enum, names, sizes and (in the backends and
// comm layers) the cuBLAS / NCCL / MPI mappings are all generated from it, so
// adding a type is one line here plus one line in each mapping table.
//
// Conversions (float -> low precision), all round-to-nearest-even:
//   bf16     IEEE-style: overflow -> inf, NaN -> quiet NaN (sign kept).
//   f16      IEEE binary16: subnormals kept, overflow -> inf, NaN -> quiet NaN.
//   f8e4m3   OCP E4M3 ("fn"): no infinities; S.1111.111 is NaN; max 448.
//            Saturating: |x| > 448 and +-inf -> +-448; NaN -> NaN.
//   f8e5m2   OCP E5M2: IEEE-like encodings (inf and NaN exist); max 57344.
//            Saturating: |x| > 57344 and +-inf -> +-57344; NaN -> NaN.
// (The saturating behaviour for fp8 is the OCP spec's "saturation mode", the
// same as CUDA's __NV_SATFINITE, which is what training recipes use.)
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace zt {

// Storage types for the low-precision formats: raw bits, no arithmetic.
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };
struct f8e4m3 { uint8_t bits; };
struct f8e5m2 { uint8_t bits; };

//        enum      C++ type  bytes  name       floating
#define ZT_DTYPES(X)                         \
  X(f32,    float,    4, "f32",    true)     \
  X(bf16,   bf16,     2, "bf16",   true)     \
  X(f16,    f16,      2, "f16",    true)     \
  X(f8e4m3, f8e4m3,   1, "f8e4m3", true)     \
  X(f8e5m2, f8e5m2,   1, "f8e5m2", true)     \
  X(i32,    int32_t,  4, "i32",    false)    \
  X(i64,    int64_t,  8, "i64",    false)    \
  X(u16,    uint16_t, 2, "u16",    false)    \
  X(u32,    uint32_t, 4, "u32",    false)

enum class DType : uint8_t {
#define ZT_X(id, type, bytes, name, fl) id,
  ZT_DTYPES(ZT_X)
#undef ZT_X
};

inline constexpr int kNumDTypes = 0
#define ZT_X(id, type, bytes, name, fl) +1
    ZT_DTYPES(ZT_X)
#undef ZT_X
    ;

constexpr size_t dtype_size(DType t) {
  switch (t) {
#define ZT_X(id, type, bytes, name, fl) \
  case DType::id:                       \
    return bytes;
    ZT_DTYPES(ZT_X)
#undef ZT_X
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
#define ZT_X(id, type, bytes, name, fl) \
  case DType::id:                       \
    return name;
    ZT_DTYPES(ZT_X)
#undef ZT_X
  }
  return "?";
}

constexpr bool dtype_is_float(DType t) {
  switch (t) {
#define ZT_X(id, type, bytes, name, fl) \
  case DType::id:                       \
    return fl;
    ZT_DTYPES(ZT_X)
#undef ZT_X
  }
  return false;
}

// Parses "f32", "bf16", ... (also "float32", "bfloat16", "float16", "fp32",
// "fp16"); throws zt::Error listing the valid names otherwise.
DType parse_dtype(std::string_view s);

// The DType of a C++ storage type: dtype_of<float>() == DType::f32.
template <typename T>
constexpr DType dtype_of();
#define ZT_X(id, type, bytes, name, fl) \
  template <>                           \
  constexpr DType dtype_of<type>() {    \
    return DType::id;                   \
  }
ZT_DTYPES(ZT_X)
#undef ZT_X

// ---------------------------------------------------------------------------
// Scalar conversions. bf16 and f16 are on hot paths, so they are inline bit
// manipulation; fp8 encodes by integer rounding of the f32 bits and decodes
// through a 256-entry table.

inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(uint32_t(h.bits) << 16); }

inline bf16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{uint16_t(u >> 16)};
}

float f16_to_float(f16 h);
f16 float_to_f16(float f);
float f8e4m3_to_float(f8e4m3 h);
f8e4m3 float_to_f8e4m3(float f);
float f8e5m2_to_float(f8e5m2 h);
f8e5m2 float_to_f8e5m2(float f);

// Uniform load/store of any floating storage type as float (templates used by
// kernels: `to_float(x)` and `from_float<T>(f)`).
inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return bf16_to_float(x); }
inline float to_float(f16 x) { return f16_to_float(x); }
inline float to_float(f8e4m3 x) { return f8e4m3_to_float(x); }
inline float to_float(f8e5m2 x) { return f8e5m2_to_float(x); }

template <typename T>
T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline bf16 from_float<bf16>(float f) { return float_to_bf16(f); }
template <>
inline f16 from_float<f16>(float f) { return float_to_f16(f); }
template <>
inline f8e4m3 from_float<f8e4m3>(float f) { return float_to_f8e4m3(f); }
template <>
inline f8e5m2 from_float<f8e5m2>(float f) { return float_to_f8e5m2(f); }

}  // namespace zt
