// Hugging Face GPT-2 / Llama 3 checkpoints <-> Zettatron tensors (contract
// and name table in hf_format.h).
//
// The layout (HfModel::layout) is a JSON object:
//   format "zettatron.hf_layout", version 1, model_type ("gpt2" | "llama" | "mixtral"),
//   config_json   the original config.json text, verbatim
//   index_json    the original model.safetensors.index.json text, or null
//   prefix        "" or "transformer." (GPT-2 saved from GPT2LMHeadModel)
//   lm_head_copy  true when a tied model's file also stores lm_head.weight
//   files         [{file, tensors: [[hf_name, dtype], ...] in data order,
//                   header_order (empty: the data order), metadata,
//                   metadata_order, write_empty_metadata, hf_layout, canonical}]
//   buffers       [{name, dtype, shape, fill: "tril" | "hex", hex}] skipped
//                 buffers and how to regenerate them on export
//   dropped_buffers  buffers that could not be recorded (written back without)
//   byte_identical   whether write_hf_model can reproduce the input exactly
#include "train/hf_format.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/hash.h"
#include "ops/device.h"

namespace zt::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kLayoutFormat = "zettatron.hf_layout";
constexpr int kLayoutVersion = 1;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr size_t kMaxHexBufferBytes = 4096;  // larger non-tril buffers are dropped

// --- config.json -------------------------------------------------------------------

// The value of `key`, or nullptr when absent or null.
const json* find(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const json& j, const char* key, const std::string& where, std::optional<int64_t> def = {}) {
  const json* v = find(j, key);
  if (!v) {
    ZT_CHECK(def.has_value(), where, ": key \"", key, "\" is missing; an HF config needs it");
    return *def;
  }
  ZT_CHECK(v->is_number_integer(), where, ": key \"", key, "\" is ", v->dump(), " but must be an integer");
  return v->get<int64_t>();
}

double get_num(const json& j, const char* key, const std::string& where, std::optional<double> def = {}) {
  const json* v = find(j, key);
  if (!v) {
    ZT_CHECK(def.has_value(), where, ": key \"", key, "\" is missing; an HF config needs it");
    return *def;
  }
  ZT_CHECK(v->is_number(), where, ": key \"", key, "\" is ", v->dump(), " but must be a number");
  return v->get<double>();
}

std::string get_str(const json& j, const char* key, const std::string& where, std::optional<std::string> def = {}) {
  const json* v = find(j, key);
  if (!v) {
    ZT_CHECK(def.has_value(), where, ": key \"", key, "\" is missing; an HF config needs it");
    return *def;
  }
  ZT_CHECK(v->is_string(), where, ": key \"", key, "\" is ", v->dump(), " but must be a string");
  return v->get<std::string>();
}

bool get_bool(const json& j, const char* key, const std::string& where, bool def) {
  const json* v = find(j, key);
  if (!v) return def;
  ZT_CHECK(v->is_boolean(), where, ": key \"", key, "\" is ", v->dump(), " but must be true or false");
  return v->get<bool>();
}

// A key that must hold `want` (or be absent) because Zettatron implements only that.
void require_bool(const json& j, const char* key, const std::string& where, bool def, bool want,
                  const char* why) {
  const bool v = get_bool(j, key, where, def);
  ZT_CHECK(v == want, where, ": key \"", key, "\" is ", v ? "true" : "false", "; Zettatron supports only ",
           want ? "true" : "false", " (", why, ")");
}

void check_architectures(const json& j, const std::string& where, const char* want) {
  const json* a = find(j, "architectures");
  if (!a) return;
  ZT_CHECK(a->is_array(), where, ": key \"architectures\" is ", a->dump(), " but must be a list");
  for (const json& e : *a)
    ZT_CHECK(e.is_string() && e.get<std::string>() == want, where, ": key \"architectures\" is ", a->dump(),
             "; supported: [\"", want, "\"] (other heads have other tensors)");
}

// A float as JSON: its shortest decimal form read back as double, so 1e-5f
// is written 1e-05 rather than 9.99999974737875e-06.
json float_json(float f) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return json(std::strtod(std::string(buf, r.ptr).c_str(), nullptr));
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: ZT_FAIL("HF export dtype is ", dtype_name(t), "; supported: f32, bf16, f16");
  }
}

// "" when a and b describe the same network, else the first field that differs.
std::string config_difference(const nn::ModelConfig& a, const nn::ModelConfig& b) {
  std::ostringstream os;
  auto cmp = [&](const char* name, auto x, auto y) {
    if (os.tellp() == 0 && !(x == y)) os << name << " " << x << " vs " << y;
  };
  cmp("arch", nn::arch_name(a.arch), nn::arch_name(b.arch));
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("n_layer", a.n_layer, b.n_layer);
  cmp("d_model", a.d_model, b.d_model);
  cmp("n_head", a.n_head, b.n_head);
  cmp("n_kv_head", a.n_kv_head, b.n_kv_head);
  cmp("d_ff", a.d_ff, b.d_ff);
  cmp("max_seq_len", a.max_seq_len, b.max_seq_len);
  cmp("norm_eps", a.norm_eps, b.norm_eps);
  cmp("tied_embeddings", a.tied_embeddings, b.tied_embeddings);
  cmp("n_expert", a.n_expert, b.n_expert);
  if (a.moe()) {
    cmp("expert_top_k", a.expert_top_k, b.expert_top_k);
    cmp("expert_normalize", a.expert_normalize, b.expert_normalize);
    cmp("shared_expert_ff", a.shared_expert_ff, b.shared_expert_ff);
  }
  if (a.arch == nn::Arch::llama3) {
    cmp("rope_theta", a.rope_theta, b.rope_theta);
    cmp("rope_scaling.enabled", a.rope_scaling.enabled, b.rope_scaling.enabled);
    if (a.rope_scaling.enabled) {
      cmp("rope_scaling.factor", a.rope_scaling.factor, b.rope_scaling.factor);
      cmp("rope_scaling.low_freq_factor", a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
      cmp("rope_scaling.high_freq_factor", a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
      cmp("rope_scaling.original_max_position", a.rope_scaling.original_max_position,
          b.rope_scaling.original_max_position);
    }
  }
  return os.str();
}

// --- the name table ------------------------------------------------------------------

enum class Op {
  copy,       // same shape
  vocab,      // hf = zt rows [0, vocab_size)
  transpose,  // hf (in, out) = zt (out, in)^T  (GPT-2 Conv1D)
  rows,       // hf = zt rows [r0, r1) (of a 3-D tensor: rows of its (E d1, d2) view)
  rope_rows,  // hf = zt rows [r0, r1), each head of D rows permuted interleaved -> rotate_half
};

struct Piece {
  std::string hf, zt;
  Op op;
  Shape hf_shape;
  int64_t r0 = 0, r1 = 0;
  int64_t head_dim = 0;    // rope_rows
  bool duplicate = false;  // a tied lm_head.weight stored anyway: must equal the embedding
};

// Zettatron's parameters (names, shapes) in model order - the same table as
// nn/transformer.cpp, checked against a Transformer by the tests.
std::vector<std::pair<std::string, Shape>> zt_params(const nn::ModelConfig& c) {
  const int64_t C = c.d_model, Vp = c.padded_vocab();
  const bool b = c.has_bias();
  std::vector<std::pair<std::string, Shape>> v{{"embed.wte", Shape{Vp, C}}};
  if (c.learned_positions()) v.push_back({"embed.wpe", Shape{c.max_seq_len, C}});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    v.push_back({p + "attn_norm.weight", Shape{C}});
    if (b) v.push_back({p + "attn_norm.bias", Shape{C}});
    v.push_back({p + "attn.qkv.weight", Shape{c.qkv_width(), C}});
    if (b) v.push_back({p + "attn.qkv.bias", Shape{c.qkv_width()}});
    v.push_back({p + "attn.proj.weight", Shape{C, C}});
    if (b) v.push_back({p + "attn.proj.bias", Shape{C}});
    v.push_back({p + "mlp_norm.weight", Shape{C}});
    if (b) v.push_back({p + "mlp_norm.bias", Shape{C}});
    if (c.moe()) {
      v.push_back({p + "mlp.router.weight", Shape{c.n_expert, C}});
      v.push_back({p + "mlp.experts.in.weight", Shape{c.n_expert, c.mlp_in_width(), C}});
      v.push_back({p + "mlp.experts.out.weight", Shape{c.n_expert, C, c.d_ff}});
      if (c.shared_expert()) {
        v.push_back({p + "mlp.shared.in.weight", Shape{2 * c.shared_expert_ff, C}});
        v.push_back({p + "mlp.shared.out.weight", Shape{C, c.shared_expert_ff}});
      }
      continue;
    }
    v.push_back({p + "mlp.in.weight", Shape{c.mlp_in_width(), C}});
    if (b) v.push_back({p + "mlp.in.bias", Shape{c.mlp_in_width()}});
    v.push_back({p + "mlp.out.weight", Shape{C, c.d_ff}});
    if (b) v.push_back({p + "mlp.out.bias", Shape{C}});
  }
  v.push_back({"final_norm.weight", Shape{C}});
  if (b) v.push_back({"final_norm.bias", Shape{C}});
  if (!c.tied_embeddings) v.push_back({"lm_head.weight", Shape{Vp, C}});
  return v;
}

// The HF tensors of cfg in state_dict (module) order, which is also the
// order save_pretrained fills shards in.
std::vector<Piece> hf_pieces(const nn::ModelConfig& c, const std::string& prefix, bool lm_head_copy) {
  const int64_t C = c.d_model, V = c.vocab_size, F = c.d_ff, T = c.max_seq_len;
  std::vector<Piece> v;
  auto add = [&](std::string hf, std::string zt, Op op, Shape s, int64_t r0 = 0, int64_t r1 = 0) {
    v.push_back(Piece{std::move(hf), std::move(zt), op, s, r0, r1, c.head_dim(), false});
  };
  if (c.arch == nn::Arch::gpt2) {
    const std::string& p = prefix;
    add(p + "wte.weight", "embed.wte", Op::vocab, Shape{V, C});
    add(p + "wpe.weight", "embed.wpe", Op::copy, Shape{T, C});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string h = p + "h." + std::to_string(i) + ".", z = "layers." + std::to_string(i) + ".";
      add(h + "ln_1.weight", z + "attn_norm.weight", Op::copy, Shape{C});
      add(h + "ln_1.bias", z + "attn_norm.bias", Op::copy, Shape{C});
      add(h + "attn.c_attn.weight", z + "attn.qkv.weight", Op::transpose, Shape{C, 3 * C});
      add(h + "attn.c_attn.bias", z + "attn.qkv.bias", Op::copy, Shape{3 * C});
      add(h + "attn.c_proj.weight", z + "attn.proj.weight", Op::transpose, Shape{C, C});
      add(h + "attn.c_proj.bias", z + "attn.proj.bias", Op::copy, Shape{C});
      add(h + "ln_2.weight", z + "mlp_norm.weight", Op::copy, Shape{C});
      add(h + "ln_2.bias", z + "mlp_norm.bias", Op::copy, Shape{C});
      add(h + "mlp.c_fc.weight", z + "mlp.in.weight", Op::transpose, Shape{C, F});
      add(h + "mlp.c_fc.bias", z + "mlp.in.bias", Op::copy, Shape{F});
      add(h + "mlp.c_proj.weight", z + "mlp.out.weight", Op::transpose, Shape{F, C});
      add(h + "mlp.c_proj.bias", z + "mlp.out.bias", Op::copy, Shape{C});
    }
    add(p + "ln_f.weight", "final_norm.weight", Op::copy, Shape{C});
    add(p + "ln_f.bias", "final_norm.bias", Op::copy, Shape{C});
  } else {
    const int64_t D = c.head_dim(), q = c.n_head * D, kv = c.n_kv_head * D;
    add("model.embed_tokens.weight", "embed.wte", Op::vocab, Shape{V, C});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string m = "model.layers." + std::to_string(i) + ".", z = "layers." + std::to_string(i) + ".";
      add(m + "self_attn.q_proj.weight", z + "attn.qkv.weight", Op::rope_rows, Shape{q, C}, 0, q);
      add(m + "self_attn.k_proj.weight", z + "attn.qkv.weight", Op::rope_rows, Shape{kv, C}, q, q + kv);
      add(m + "self_attn.v_proj.weight", z + "attn.qkv.weight", Op::rows, Shape{kv, C}, q + kv, q + 2 * kv);
      add(m + "self_attn.o_proj.weight", z + "attn.proj.weight", Op::copy, Shape{C, C});
      if (c.moe()) {  // Mixtral: the router, then per expert w1 (gate), w2 (down), w3 (up)
        const std::string e = m + "block_sparse_moe.";
        add(e + "gate.weight", z + "mlp.router.weight", Op::copy, Shape{c.n_expert, C});
        for (int64_t x = 0; x < c.n_expert; ++x) {
          const std::string w = e + "experts." + std::to_string(x) + ".";
          add(w + "w1.weight", z + "mlp.experts.in.weight", Op::rows, Shape{F, C}, 2 * F * x, 2 * F * x + F);
          add(w + "w2.weight", z + "mlp.experts.out.weight", Op::rows, Shape{C, F}, C * x, C * (x + 1));
          add(w + "w3.weight", z + "mlp.experts.in.weight", Op::rows, Shape{F, C}, 2 * F * x + F, 2 * F * (x + 1));
        }
      } else {
        add(m + "mlp.gate_proj.weight", z + "mlp.in.weight", Op::rows, Shape{F, C}, 0, F);
        add(m + "mlp.up_proj.weight", z + "mlp.in.weight", Op::rows, Shape{F, C}, F, 2 * F);
        add(m + "mlp.down_proj.weight", z + "mlp.out.weight", Op::copy, Shape{C, F});
      }
      add(m + "input_layernorm.weight", z + "attn_norm.weight", Op::copy, Shape{C});
      add(m + "post_attention_layernorm.weight", z + "mlp_norm.weight", Op::copy, Shape{C});
    }
    add("model.norm.weight", "final_norm.weight", Op::copy, Shape{C});
  }
  // The head is never prefixed ("lm_head.weight" beside "transformer.*").
  if (!c.tied_embeddings) {
    add("lm_head.weight", "lm_head.weight", Op::vocab, Shape{V, C});
  } else if (lm_head_copy) {
    add("lm_head.weight", "embed.wte", Op::vocab, Shape{V, C});
    v.back().duplicate = true;
  }
  return v;
}

// Non-parameter buffers some HF files carry: GPT-2's causal mask
// (h.i.attn.bias, (1, 1, T, T)) and masked_bias (a scalar), old Llama files'
// rotary_emb.inv_freq. They hold no weights; import skips them.
bool is_buffer(nn::Arch arch, const std::string& name, const std::string& prefix) {
  auto layer_suffix = [&](const std::string& head, std::string_view& rest) {
    if (name.compare(0, head.size(), head) != 0) return false;
    size_t i = head.size(), digits = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i, ++digits;
    if (digits == 0) return false;
    rest = std::string_view(name).substr(i);
    return true;
  };
  std::string_view rest;
  if (arch == nn::Arch::gpt2)
    return layer_suffix(prefix + "h.", rest) && (rest == ".attn.bias" || rest == ".attn.masked_bias");
  return layer_suffix("model.layers.", rest) && rest == ".self_attn.rotary_emb.inv_freq";
}

// --- element conversions (CPU) ---------------------------------------------------

double load(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::f32: return reinterpret_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_float(reinterpret_cast<const bf16*>(p)[i]);
    case DType::f16: return f16_to_float(reinterpret_cast<const f16*>(p)[i]);
    default: ZT_ASSERT(false, "load of ", dtype_name(t.dtype()));
  }
  return 0;
}

// A new CPU f32 tensor with t's values (exact for f32/bf16/f16).
Tensor to_f32(const Tensor& src) {
  const Tensor t = ops::on_device(src, Device::cpu(), MemCategory::workspace);
  ZT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16, "tensor ", t.str(),
           " is not a float tensor; HF weights are F32, BF16 or F16");
  Tensor out = Tensor::empty(t.shape(), DType::f32, Device::cpu(), MemCategory::params);
  float* o = out.data<float>();
  if (t.dtype() == DType::f32) {
    std::memcpy(o, t.data_ptr(), t.nbytes());
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) o[i] = float(load(t, i));
  }
  return out;
}

// f32 -> dtype (round to nearest even), a new CPU tensor.
Tensor cast_f32(const Tensor& t, DType dtype) {
  if (dtype == DType::f32) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, Device::cpu(), MemCategory::workspace);
  const float* s = t.data<float>();
  const int64_t n = t.numel();
  if (dtype == DType::bf16) {
    bf16* o = out.data<bf16>();
    for (int64_t i = 0; i < n; ++i) o[i] = float_to_bf16(s[i]);
  } else if (dtype == DType::f16) {
    f16* o = out.data<f16>();
    for (int64_t i = 0; i < n; ++i) o[i] = float_to_f16(s[i]);
  } else {
    ZT_FAIL("HF weights can be written as F32, BF16 or F16, not ", dtype_name(dtype));
  }
  return out;
}

// Row r of the HF tensor of a rope_rows piece comes from this row of the
// Zettatron tensor: within a head, rotate_half row j < D/2 is interleaved row
// 2j and row D/2 + j is row 2j + 1.
int64_t rope_source_row(const Piece& pc, int64_t r) {
  const int64_t D = pc.head_dim, head = r / D, j = r % D;
  return pc.r0 + head * D + (j < D / 2 ? 2 * j : 2 * (j - D / 2) + 1);
}

// The HF tensor (f32, pc.hf_shape) of a piece of the Zettatron tensor z (f32).
Tensor export_piece(const Piece& pc, const Tensor& z) {
  Tensor h = Tensor::empty(pc.hf_shape, DType::f32, Device::cpu(), MemCategory::workspace);
  const float* zs = z.data<float>();
  float* hd = h.data<float>();
  const int64_t cols = z.ndim() >= 2 ? z.size(-1) : 1;
  switch (pc.op) {
    case Op::copy:
    case Op::vocab:  // the first V rows
      std::memcpy(hd, zs, h.nbytes());
      break;
    case Op::rows: std::memcpy(hd, zs + pc.r0 * cols, h.nbytes()); break;
    case Op::transpose: {
      const int64_t R = z.size(0), K = z.size(1);  // z (R, K) -> h (K, R)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < K; ++k) hd[k * R + r] = zs[r * K + k];
      break;
    }
    case Op::rope_rows:
      for (int64_t r = 0; r < pc.r1 - pc.r0; ++r)
        std::memcpy(hd + r * cols, zs + rope_source_row(pc, r) * cols, size_t(cols) * sizeof(float));
      break;
  }
  return h;
}

// The inverse: writes the HF tensor h (f32) into its rows / transpose of z.
void import_piece(const Piece& pc, const Tensor& h, const Tensor& z) {
  const float* hs = h.data<float>();
  float* zd = z.data<float>();
  const int64_t cols = z.ndim() >= 2 ? z.size(-1) : 1;
  switch (pc.op) {
    case Op::copy:
    case Op::vocab: std::memcpy(zd, hs, h.nbytes()); break;  // padding rows stay zero
    case Op::rows: std::memcpy(zd + pc.r0 * cols, hs, h.nbytes()); break;
    case Op::transpose: {
      const int64_t R = z.size(0), K = z.size(1);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < K; ++k) zd[r * K + k] = hs[k * R + r];
      break;
    }
    case Op::rope_rows:
      for (int64_t r = 0; r < pc.r1 - pc.r0; ++r)
        std::memcpy(zd + rope_source_row(pc, r) * cols, hs + r * cols, size_t(cols) * sizeof(float));
      break;
  }
}

// --- buffers -----------------------------------------------------------------------

std::vector<uint8_t> from_hex(const std::string& s, const std::string& where) {
  auto nibble = [&](char c) -> uint8_t {
    if (c >= '0' && c <= '9') return uint8_t(c - '0');
    if (c >= 'a' && c <= 'f') return uint8_t(c - 'a' + 10);
    ZT_FAIL(where, ": invalid hex digit '", c, "'");
  };
  ZT_CHECK(s.size() % 2 == 0, where, ": hex string of odd length");
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return out;
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// 1 on and below the diagonal of the last two (square) dims, 0 above: GPT-2's causal mask.
bool is_tril(const Tensor& t) {
  if (!is_float(t.dtype()) || t.ndim() < 2 || t.size(-1) != t.size(-2)) return false;
  const int64_t n = t.size(-1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t row = (i / n) % n, col = i % n;
    if (load(t, i) != (col <= row ? 1.0 : 0.0)) return false;
  }
  return true;
}

Tensor make_tril(const Shape& shape, DType dtype) {
  Tensor f = Tensor::empty(shape, DType::f32, Device::cpu(), MemCategory::workspace);
  const int64_t n = shape[-1];
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = (i % n) <= (i / n) % n ? 1.0f : 0.0f;
  return cast_f32(f, dtype);
}

// How to regenerate a skipped buffer, or null when it is too big to record.
json record_buffer(const std::string& name, const Tensor& t) {
  json b = {{"name", name},
            {"dtype", std::string(ckpt::safetensors_dtype_name(t.dtype()))},
            {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())}};
  if (is_tril(t)) {
    b["fill"] = "tril";
  } else if (t.nbytes() <= kMaxHexBufferBytes) {
    b["fill"] = "hex";
    b["hex"] = hex_bytes(t.data_ptr(), t.nbytes());
  } else {
    return nullptr;
  }
  return b;
}

Tensor regenerate_buffer(const json& b) {
  const std::string name = b.at("name").get<std::string>();
  const auto dt = ckpt::dtype_from_safetensors(b.at("dtype").get<std::string>());
  ZT_CHECK(dt.has_value(), "HF layout: buffer '", name, "' has unknown dtype ", b.at("dtype").dump());
  const auto dims = b.at("shape").get<std::vector<int64_t>>();
  const Shape shape(dims.begin(), dims.end());
  if (b.at("fill") == "tril") {
    ZT_CHECK(is_float(*dt) && shape.ndim() >= 2 && shape[-1] == shape[-2], "HF layout: buffer '", name,
             "' is marked tril but has dtype ", dtype_name(*dt), " shape ", shape.str());
    return make_tril(shape, *dt);
  }
  const std::vector<uint8_t> bytes = from_hex(b.at("hex").get<std::string>(), "HF layout: buffer '" + name + "'");
  Tensor t = Tensor::empty(shape, *dt, Device::cpu(), MemCategory::workspace);
  ZT_CHECK(bytes.size() == t.nbytes(), "HF layout: buffer '", name, "' has ", bytes.size(), " bytes for ",
           t.str());
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// --- files -------------------------------------------------------------------------

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  ZT_CHECK(f.good(), "cannot open ", p.string(), " for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  ZT_CHECK(!f.bad(), "error reading ", p.string());
  return ss.str();
}

json parse_json(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ZT_FAIL(where, " is not valid JSON: ", e.what());
  }
}

// tmp + rename, like write_safetensors (a crash leaves no half-written file).
void write_text(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    ZT_CHECK(f.good(), "cannot create ", tmp.string());
    f.write(text.data(), std::streamsize(text.size()));
    f.flush();
    ZT_CHECK(f.good(), "error writing ", tmp.string(), " (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  ZT_CHECK(!ec, "cannot rename ", tmp.string(), " to ", p.string(), ": ", ec.message());
}

// Position in the order Python safetensors writes dtypes (widest first).
int hf_dtype_rank(DType t) {
  static const DType order[] = {DType::i64, DType::f32,    DType::u32,   DType::i32,  DType::bf16,
                                DType::f16, DType::u16, DType::f8e4m3, DType::f8e5m2};
  for (size_t i = 0; i < std::size(order); ++i)
    if (order[i] == t) return int(i);
  return int(std::size(order));
}

bool in_hf_order(const ckpt::SafetensorsFile& f) {
  const auto names = f.names();
  for (size_t i = 1; i < names.size(); ++i) {
    const int a = hf_dtype_rank(f.info(names[i - 1]).dtype), b = hf_dtype_rank(f.info(names[i]).dtype);
    if (a > b || (a == b && names[i - 1] > names[i])) return false;
  }
  return true;
}

// A file name from a layout or index: plain, inside the directory.
void check_file_name(const std::string& f, const std::string& where) {
  ZT_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos && f != "." &&
               f != "..",
           where, ": file name '", f, "' must be a plain name inside the model directory");
}

std::string join(const std::vector<std::string>& lines, size_t max_lines = 30) {
  std::string s;
  for (size_t i = 0; i < lines.size() && i < max_lines; ++i) s += "\n  " + lines[i];
  if (lines.size() > max_lines) s += "\n  ... and " + std::to_string(lines.size() - max_lines) + " more";
  return s;
}

// out_dir must not exist or be empty: an export never overwrites files.
void prepare_out_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    ZT_CHECK(fs::is_directory(dir), "HF export: '", dir.string(), "' exists and is not a directory");
    ZT_CHECK(fs::is_empty(dir), "HF export: '", dir.string(),
             "' is not empty; write into a new or empty directory (existing files are never overwritten)");
  } else {
    fs::create_directories(dir, ec);
    ZT_CHECK(!ec, "HF export: cannot create '", dir.string(), "': ", ec.message());
  }
}

// The Zettatron tensors as CPU f32, keyed by name; exactly cfg's parameters.
std::map<std::string, Tensor> check_model_tensors(const nn::ModelConfig& cfg,
                                                  const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::map<std::string, Tensor> given;
  std::vector<std::string> problems;
  for (const auto& [name, t] : tensors)
    if (!given.emplace(name, t).second) problems.push_back(name + ": given twice");
  std::set<std::string> expected;
  for (const auto& [name, shape] : zt_params(cfg)) {
    expected.insert(name);
    const auto it = given.find(name);
    if (it == given.end()) {
      problems.push_back(name + ": missing (expected shape " + shape.str() + ")");
    } else if (!it->second.defined() || it->second.shape() != shape || !is_float(it->second.dtype())) {
      problems.push_back(name + ": got " + (it->second.defined() ? it->second.str() : "an undefined tensor") +
                         ", expected a float tensor of shape " + shape.str());
    }
  }
  for (const auto& [name, t] : given)
    if (!expected.count(name)) problems.push_back(name + ": not a parameter of this " +
                                                  std::string(nn::arch_name(cfg.arch)) + " model");
  ZT_CHECK(problems.empty(), "HF export: the tensors do not match the model config:", join(problems));
  for (auto& [name, t] : given) t = to_f32(t);
  return given;
}

}  // namespace

// --- config ------------------------------------------------------------------------

nn::ModelConfig config_from_hf(const json& j, const std::string& where) {
  ZT_CHECK(j.is_object(), where, ": an HF config must be a JSON object");
  const std::string type = get_str(j, "model_type", where);
  nn::ModelConfig c;
  if (type == "gpt2") {
    check_architectures(j, where, "GPT2LMHeadModel");
    c.arch = nn::Arch::gpt2;
    c.vocab_size = get_int(j, "vocab_size", where);
    c.max_seq_len = get_int(j, "n_positions", where);
    c.d_model = get_int(j, "n_embd", where);
    c.n_layer = get_int(j, "n_layer", where);
    c.n_head = c.n_kv_head = get_int(j, "n_head", where);
    c.d_ff = get_int(j, "n_inner", where, 4 * c.d_model);
    c.norm_eps = float(get_num(j, "layer_norm_epsilon", where));
    const std::string act = get_str(j, "activation_function", where, "gelu_new");
    ZT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", where, ": key \"activation_function\" is \"", act,
             "\"; supported: \"gelu_new\" (GeLU, tanh approximation)");
    c.tied_embeddings = get_bool(j, "tie_word_embeddings", where, true);
    require_bool(j, "scale_attn_weights", where, true, true, "attention scores are scaled by 1/sqrt(head_dim)");
    require_bool(j, "scale_attn_by_inverse_layer_idx", where, false, false, "no per-layer score scaling");
    require_bool(j, "add_cross_attention", where, false, false, "decoder-only");
  } else if (type == "llama" || type == "mixtral") {
    const bool mixtral = type == "mixtral";
    check_architectures(j, where, mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM");
    c.arch = nn::Arch::llama3;
    c.vocab_size = get_int(j, "vocab_size", where);
    c.d_model = get_int(j, "hidden_size", where);
    c.d_ff = get_int(j, "intermediate_size", where);
    c.n_layer = get_int(j, "num_hidden_layers", where);
    c.n_head = get_int(j, "num_attention_heads", where);
    c.n_kv_head = get_int(j, "num_key_value_heads", where, c.n_head);
    c.max_seq_len = get_int(j, "max_position_embeddings", where);
    c.norm_eps = float(get_num(j, "rms_norm_eps", where));
    c.rope_theta = get_num(j, "rope_theta", where, 10000.0);
    c.tied_embeddings = get_bool(j, "tie_word_embeddings", where, false);
    const std::string act = get_str(j, "hidden_act", where, "silu");
    ZT_CHECK(act == "silu", where, ": key \"hidden_act\" is \"", act, "\"; supported: \"silu\" (SwiGLU MLP)");
    if (mixtral) {
      // Mixtral: every block's MLP is experts behind a router, top k renormalised.
      c.n_expert = get_int(j, "num_local_experts", where);
      c.expert_top_k = get_int(j, "num_experts_per_tok", where);
      c.expert_normalize = true;
      c.router_aux_loss = float(get_num(j, "router_aux_loss_coef", where, 0.001));
      if (const json* sw = find(j, "sliding_window"))
        ZT_CHECK(sw->is_number_integer() && sw->get<int64_t>() >= c.max_seq_len, where, ": key \"sliding_window\" is ",
                 sw->dump(), " but Zettatron's attention is full causal attention; only null or a window of at least "
                 "max_position_embeddings = ", c.max_seq_len, " (no effect) is supported");
      const double jitter = get_num(j, "router_jitter_noise", where, 0.0);
      ZT_CHECK(jitter == 0.0, where, ": key \"router_jitter_noise\" is ", jitter,
               "; Zettatron's router adds no noise: only 0 is supported");
    }
    require_bool(j, "attention_bias", where, false, false, "Llama projections have no bias");
    require_bool(j, "mlp_bias", where, false, false, "Llama projections have no bias");
    if (const json* hd = find(j, "head_dim")) {
      ZT_CHECK(c.n_head > 0 && hd->is_number_integer() && hd->get<int64_t>() * c.n_head == c.d_model, where,
               ": key \"head_dim\" is ", hd->dump(), " but hidden_size / num_attention_heads = ", c.d_model, " / ",
               c.n_head, "; Zettatron supports only head_dim = hidden_size / num_attention_heads");
    }
    if (const json* rs = find(j, "rope_scaling")) {
      const std::string w = where + ": key \"rope_scaling\"";
      ZT_CHECK(rs->is_object(), w, " is ", rs->dump(), " but must be null or an object");
      const std::string kind = find(*rs, "rope_type") ? get_str(*rs, "rope_type", w) : get_str(*rs, "type", w);
      ZT_CHECK(kind == "llama3" || kind == "default", w, " has rope_type \"", kind,
               "\"; supported: null or \"llama3\" (Llama 3.1 frequency scaling)");
      if (kind == "llama3") {
        c.rope_scaling.enabled = true;
        c.rope_scaling.factor = float(get_num(*rs, "factor", w));
        c.rope_scaling.low_freq_factor = float(get_num(*rs, "low_freq_factor", w));
        c.rope_scaling.high_freq_factor = float(get_num(*rs, "high_freq_factor", w));
        c.rope_scaling.original_max_position = get_int(*rs, "original_max_position_embeddings", w);
      } else {
        c.rope_scaling.enabled = false;
      }
    } else {
      c.rope_scaling.enabled = false;
    }
  } else {
    ZT_FAIL(where, ": key \"model_type\" is \"", type,
            "\"; supported: \"gpt2\" (GPT2LMHeadModel), \"llama\" (LlamaForCausalLM, Llama 3) and \"mixtral\" "
            "(MixtralForCausalLM)");
  }
  c.validate();
  return c;
}

json hf_config(const nn::ModelConfig& c, DType dtype) {
  c.validate();
  const char* torch_dtype = torch_dtype_name(dtype);
  if (c.arch == nn::Arch::gpt2) {
    return json{{"activation_function", "gelu_new"},
                {"architectures", {"GPT2LMHeadModel"}},
                {"layer_norm_epsilon", float_json(c.norm_eps)},
                {"model_type", "gpt2"},
                {"n_ctx", c.max_seq_len},
                {"n_embd", c.d_model},
                {"n_head", c.n_head},
                {"n_inner", c.d_ff == 4 * c.d_model ? json(nullptr) : json(c.d_ff)},
                {"n_layer", c.n_layer},
                {"n_positions", c.max_seq_len},
                {"tie_word_embeddings", c.tied_embeddings},
                {"torch_dtype", torch_dtype},
                {"vocab_size", c.vocab_size}};
  }
  json scaling = nullptr;
  if (c.rope_scaling.enabled)
    scaling = json{{"factor", float_json(c.rope_scaling.factor)},
                   {"high_freq_factor", float_json(c.rope_scaling.high_freq_factor)},
                   {"low_freq_factor", float_json(c.rope_scaling.low_freq_factor)},
                   {"original_max_position_embeddings", c.rope_scaling.original_max_position},
                   {"rope_type", "llama3"}};
  if (c.moe()) {
    ZT_CHECK(c.expert_normalize, "HF export: model.expert_normalize = false (the softmax probabilities as routing "
             "weights) has no MixtralForCausalLM equivalent, which renormalises the top k; export a model trained "
             "with expert_normalize = true");
    ZT_CHECK(!c.rope_scaling.enabled, "HF export: MixtralForCausalLM has no Llama 3 RoPE scaling; export a model "
             "with model.rope_scaling = false");
    ZT_CHECK(!c.shared_expert(), "HF export: MixtralForCausalLM has no shared expert, but model.shared_expert_ff = ",
             c.shared_expert_ff, "; keep the model in Zettatron's checkpoint format (zettatron convert --to-hf "
             "exports mixtures of experts without one)");
    return json{{"architectures", {"MixtralForCausalLM"}},
                {"attention_dropout", 0.0},
                {"head_dim", c.head_dim()},
                {"hidden_act", "silu"},
                {"hidden_size", c.d_model},
                {"intermediate_size", c.d_ff},
                {"max_position_embeddings", c.max_seq_len},
                {"model_type", "mixtral"},
                {"num_attention_heads", c.n_head},
                {"num_experts_per_tok", c.expert_top_k},
                {"num_hidden_layers", c.n_layer},
                {"num_key_value_heads", c.n_kv_head},
                {"num_local_experts", c.n_expert},
                {"output_router_logits", false},
                {"rms_norm_eps", float_json(c.norm_eps)},
                {"rope_theta", c.rope_theta},
                {"router_aux_loss_coef", float_json(c.router_aux_loss)},
                {"router_jitter_noise", 0.0},
                {"sliding_window", nullptr},
                {"tie_word_embeddings", c.tied_embeddings},
                {"torch_dtype", torch_dtype},
                {"vocab_size", c.vocab_size}};
  }
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"attention_bias", false},
              {"head_dim", c.head_dim()},
              {"hidden_act", "silu"},
              {"hidden_size", c.d_model},
              {"intermediate_size", c.d_ff},
              {"max_position_embeddings", c.max_seq_len},
              {"mlp_bias", false},
              {"model_type", "llama"},
              {"num_attention_heads", c.n_head},
              {"num_hidden_layers", c.n_layer},
              {"num_key_value_heads", c.n_kv_head},
              {"rms_norm_eps", float_json(c.norm_eps)},
              {"rope_scaling", scaling},
              {"rope_theta", c.rope_theta},
              {"tie_word_embeddings", c.tied_embeddings},
              {"torch_dtype", torch_dtype},
              {"vocab_size", c.vocab_size}};
}

// --- import ------------------------------------------------------------------------

HfModel read_hf_model(const std::string& dir_arg) {
  const fs::path dir(dir_arg);
  ZT_CHECK(fs::is_directory(dir), "HF import: '", dir_arg,
           "' is not a directory; pass a Hugging Face model directory (config.json + model.safetensors)");
  const fs::path cfg_path = dir / "config.json";
  ZT_CHECK(fs::is_regular_file(cfg_path), "HF import: '", dir_arg, "' has no config.json");
  HfModel out;
  const std::string config_text = read_text(cfg_path);
  out.config = config_from_hf(parse_json(config_text, cfg_path.string()), cfg_path.string());
  const nn::ModelConfig& cfg = out.config;

  // The files: one, or the index's shards (sorted by name).
  const bool single = fs::exists(dir / kSingleFile), sharded = fs::exists(dir / kIndexFile);
  ZT_CHECK(!(single && sharded), "HF import: '", dir_arg, "' has both ", kSingleFile, " and ", kIndexFile,
           "; remove the one that is stale");
  ZT_CHECK(single || sharded, "HF import: '", dir_arg, "' has neither ", kSingleFile, " nor ", kIndexFile,
           fs::exists(dir / "pytorch_model.bin") ? "; it holds PyTorch .bin weights: convert them to safetensors first"
                                                : "");
  std::string index_text;
  std::map<std::string, std::string> weight_map;  // hf name -> file
  std::vector<std::string> file_names{kSingleFile};
  if (sharded) {
    const std::string where = (dir / kIndexFile).string();
    index_text = read_text(dir / kIndexFile);
    const json index = parse_json(index_text, where);
    ZT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), where,
             ": expected {\"metadata\": {...}, \"weight_map\": {tensor: file}}");
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) {
      ZT_CHECK(file.is_string(), where, ": weight_map[\"", name, "\"] is ", file.dump(), " but must be a file name");
      check_file_name(file.get<std::string>(), where);
      weight_map[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
    file_names.clear();  // (a loop: assign() from set iterators trips a GCC 12 false warning)
    for (const std::string& f : files) file_names.push_back(f);
  }

  // Every tensor of every file, by HF name.
  std::vector<ckpt::SafetensorsFile> files;
  std::map<std::string, size_t> where_is;  // hf name -> index into files
  std::vector<std::string> problems;
  for (size_t f = 0; f < file_names.size(); ++f) {
    const fs::path p = dir / file_names[f];
    ZT_CHECK(fs::exists(p), "HF import: ", kIndexFile, " lists ", file_names[f], ", which is not in '", dir_arg, "'");
    files.push_back(ckpt::SafetensorsFile::open(p.string()));
    for (const std::string& name : files.back().names()) {
      if (!where_is.emplace(name, f).second) {
        problems.push_back(name + ": stored in both " + file_names[where_is[name]] + " and " + file_names[f]);
      } else if (sharded) {
        const auto it = weight_map.find(name);
        if (it == weight_map.end())
          problems.push_back(name + ": in " + file_names[f] + " but not in the index's weight_map");
        else if (it->second != file_names[f])
          problems.push_back(name + ": in " + file_names[f] + " but the index says " + it->second);
      }
    }
  }
  for (const auto& [name, file] : weight_map)
    if (!where_is.count(name)) problems.push_back(name + ": the index lists it in " + file + ", which lacks it");

  const bool gpt2 = cfg.arch == nn::Arch::gpt2;
  const std::string prefix = gpt2 && where_is.count("transformer.wte.weight") ? "transformer." : "";
  const bool lm_head_copy = cfg.tied_embeddings && where_is.count("lm_head.weight");
  const std::vector<Piece> pieces = hf_pieces(cfg, prefix, lm_head_copy);

  std::set<std::string> expected;
  for (const Piece& pc : pieces) {
    expected.insert(pc.hf);
    const auto it = where_is.find(pc.hf);
    if (it == where_is.end()) {
      problems.push_back(pc.hf + ": missing (expected shape " + pc.hf_shape.str() + ")");
      continue;
    }
    const ckpt::TensorInfo& info = files[it->second].info(pc.hf);
    if (info.shape != pc.hf_shape)
      problems.push_back(pc.hf + ": file has shape " + info.shape.str() + ", expected shape " + pc.hf_shape.str() +
                         " (from config.json)");
    if (!is_float(info.dtype))
      problems.push_back(pc.hf + ": dtype " + std::string(ckpt::safetensors_dtype_name(info.dtype)) +
                         "; supported: F32, BF16, F16");
  }
  std::vector<std::string> buffer_names;
  for (const auto& [name, f] : where_is) {
    if (expected.count(name)) continue;
    if (is_buffer(cfg.arch, name, prefix))
      buffer_names.push_back(name);
    else
      problems.push_back(name + ": unexpected tensor (in " + file_names[f] + ") for a " +
                         std::string(nn::arch_name(cfg.arch)) + " model with this config");
  }
  ZT_CHECK(problems.empty(), "HF import: '", dir_arg, "' does not match its config.json:", join(problems));

  // Convert: every Zettatron tensor starts as zeros (vocabulary padding rows stay so).
  std::map<std::string, Tensor> zt;
  for (const auto& [name, shape] : zt_params(cfg)) {
    Tensor t = Tensor::empty(shape, DType::f32, Device::cpu(), MemCategory::params);
    std::memset(t.data_ptr(), 0, t.nbytes());
    zt.emplace(name, t);
    out.tensors.emplace_back(name, t);
  }
  for (const Piece& pc : pieces) {
    const Tensor h = to_f32(files[where_is.at(pc.hf)].tensor(pc.hf));
    if (pc.duplicate) {
      const Tensor& wte = zt.at(pc.zt);
      ZT_CHECK(std::memcmp(wte.data_ptr(), h.data_ptr(), h.nbytes()) == 0, "HF import: '", dir_arg,
               "': tie_word_embeddings is true but lm_head.weight differs from the embedding; set "
               "tie_word_embeddings to false in config.json if the head is meant to be separate");
      continue;
    }
    import_piece(pc, h, zt.at(pc.zt));
  }

  // The layout: everything else write_hf_model needs for a byte-identical copy.
  json layout = {{"format", kLayoutFormat},
                 {"version", kLayoutVersion},
                 {"model_type", gpt2 ? "gpt2" : cfg.moe() ? "mixtral" : "llama"},
                 {"config_json", config_text},
                 {"index_json", sharded ? json(index_text) : json(nullptr)},
                 {"prefix", prefix},
                 {"lm_head_copy", lm_head_copy},
                 {"files", json::array()},
                 {"buffers", json::array()},
                 {"dropped_buffers", json::array()}};
  bool identical = true;
  for (size_t f = 0; f < files.size(); ++f) {
    const ckpt::SafetensorsFile& file = files[f];
    const ckpt::SafetensorsWriteOptions lo = file.layout();
    json names = json::array();
    for (const std::string& n : file.names())
      names.push_back({n, std::string(ckpt::safetensors_dtype_name(file.info(n).dtype))});
    json meta = json::object();
    for (const auto& [k, v] : file.metadata()) meta[k] = v;
    const bool canonical = file.canonical();
    identical &= canonical;
    layout["files"].push_back({{"file", file_names[f]},
                               {"tensors", names},
                               {"header_order", lo.header_order},
                               {"metadata", meta},
                               {"metadata_order", lo.metadata_order},
                               {"write_empty_metadata", lo.write_empty_metadata},
                               {"hf_layout", in_hf_order(file)},
                               {"canonical", canonical}});
  }
  for (const std::string& name : buffer_names) {
    json b = record_buffer(name, files[where_is.at(name)].tensor(name));
    if (b.is_null()) {
      layout["dropped_buffers"].push_back(name);
      identical = false;
    } else {
      layout["buffers"].push_back(std::move(b));
    }
  }
  layout["byte_identical"] = identical;
  out.layout = std::move(layout);
  return out;
}

// --- export ------------------------------------------------------------------------

namespace {

struct OutFile {
  std::string name;
  ckpt::NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  ckpt::SafetensorsWriteOptions options;
};

// save_pretrained's cut: tensors in module order fill a shard until the next
// would push it past max_bytes; a tensor larger than max_bytes gets a shard
// of its own (appended before the shard being filled, as Hugging Face does).
std::vector<std::vector<size_t>> shard_plan(const ckpt::NamedTensors& tensors, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  int64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = int64_t(tensors[i].second.nbytes());
    if (max_bytes > 0 && n > max_bytes) {
      shards.push_back({i});
      continue;
    }
    if (max_bytes > 0 && current_bytes + n > max_bytes && !current.empty()) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += n;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_name(size_t i, size_t k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, k);
  return buf;
}

}  // namespace

void write_hf_model(const std::string& out_dir, const nn::ModelConfig& cfg,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, const json& layout,
                    const HfExportOptions& opt) {
  cfg.validate();
  const std::map<std::string, Tensor> zt = check_model_tensors(cfg, tensors);
  std::vector<OutFile> out;
  std::string config_text, index_text;

  if (layout.is_null()) {
    ZT_CHECK(opt.max_shard_bytes >= 0, "HF export: max_shard_bytes is ", opt.max_shard_bytes,
             "; use 0 for one file or a positive shard size");
    config_text = hf_config(cfg, opt.dtype).dump(2) + "\n";  // checks opt.dtype
    ckpt::NamedTensors all;
    for (const Piece& pc : hf_pieces(cfg, cfg.arch == nn::Arch::gpt2 ? "transformer." : "", false))
      all.emplace_back(pc.hf, cast_f32(export_piece(pc, zt.at(pc.zt)), opt.dtype));
    const auto shards = shard_plan(all, opt.max_shard_bytes);
    json weight_map = json::object();
    int64_t total = 0;
    for (size_t s = 0; s < shards.size(); ++s) {
      OutFile f{shards.size() == 1 ? kSingleFile : shard_name(s, shards.size()), {}, {{"format", "pt"}}, {}};
      f.options.hf_layout = true;
      for (size_t i : shards[s]) {
        f.tensors.push_back(all[i]);
        weight_map[all[i].first] = f.name;
        total += int64_t(all[i].second.nbytes());
      }
      out.push_back(std::move(f));
    }
    if (shards.size() > 1)
      index_text = json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
  } else {
    const std::string w = "HF export: layout";
    ZT_CHECK(layout.is_object() && layout.value("format", "") == kLayoutFormat, w,
             " is not a Zettatron HF layout (from read_hf_model); pass null to write a fresh directory");
    ZT_CHECK(layout.value("version", 0) == kLayoutVersion, w, " has version ", layout.value("version", 0),
             "; this build reads version ", kLayoutVersion);
    try {
      config_text = layout.at("config_json").get<std::string>();
      const nn::ModelConfig described = config_from_hf(parse_json(config_text, w + " config_json"), w + " config_json");
      const std::string diff = config_difference(described, cfg);
      ZT_CHECK(diff.empty(), w, " describes another model (", diff,
               "); pass a null layout to write this model in the default HF form");
      const std::string prefix = layout.at("prefix").get<std::string>();
      const bool lm_head_copy = layout.at("lm_head_copy").get<bool>();
      ZT_CHECK(prefix.empty() || (prefix == "transformer." && cfg.arch == nn::Arch::gpt2), w, " has prefix '",
               prefix, "'; expected '' or 'transformer.' (GPT-2)");
      ZT_CHECK(!lm_head_copy || cfg.tied_embeddings, w, " stores a copy of a tied head but the model is untied");

      std::map<std::string, Tensor> hf;  // f32
      for (const Piece& pc : hf_pieces(cfg, prefix, lm_head_copy)) hf.emplace(pc.hf, export_piece(pc, zt.at(pc.zt)));
      std::map<std::string, Tensor> buffers;
      for (const json& b : layout.at("buffers")) buffers.emplace(b.at("name").get<std::string>(), regenerate_buffer(b));
      std::set<std::string> dropped;
      for (const json& d : layout.at("dropped_buffers")) dropped.insert(d.get<std::string>());

      std::set<std::string> placed;
      for (const json& jf : layout.at("files")) {
        OutFile f;
        f.name = jf.at("file").get<std::string>();
        check_file_name(f.name, w);
        for (const json& e : jf.at("tensors")) {
          const std::string name = e.at(0).get<std::string>();
          const auto dt = ckpt::dtype_from_safetensors(e.at(1).get<std::string>());
          ZT_CHECK(dt.has_value(), w, ": tensor '", name, "' has unknown dtype ", e.at(1).dump());
          ZT_CHECK(placed.insert(name).second, w, " lists tensor '", name, "' twice");
          if (dropped.count(name)) continue;
          if (const auto b = buffers.find(name); b != buffers.end()) {
            ZT_CHECK(b->second.dtype() == *dt, w, ": buffer '", name, "' dtype differs from its file entry");
            f.tensors.emplace_back(name, b->second);
            continue;
          }
          const auto it = hf.find(name);
          ZT_CHECK(it != hf.end(), w, " lists tensor '", name, "', which this ", nn::arch_name(cfg.arch),
                   " model does not have");
          f.tensors.emplace_back(name, cast_f32(it->second, *dt));
        }
        for (const json& k : jf.at("header_order"))
          if (!dropped.count(k.get<std::string>())) f.options.header_order.push_back(k.get<std::string>());
        for (const auto& [k, v] : jf.at("metadata").items()) f.metadata[k] = v.get<std::string>();
        f.options.metadata_order = jf.at("metadata_order").get<std::vector<std::string>>();
        f.options.write_empty_metadata = jf.at("write_empty_metadata").get<bool>();
        out.push_back(std::move(f));
      }
      std::vector<std::string> missing;
      for (const auto& [name, t] : hf)
        if (!placed.count(name)) missing.push_back(name);
      for (const auto& [name, t] : buffers)
        if (!placed.count(name)) missing.push_back(name);
      ZT_CHECK(missing.empty(), w, " places no file for:", join(missing));

      if (const json& ij = layout.at("index_json"); !ij.is_null()) {
        index_text = ij.get<std::string>();
        if (!dropped.empty()) {  // the verbatim index would name tensors that are not written
          json index = parse_json(index_text, w + " index_json");
          int64_t total = 0;
          for (const OutFile& f : out)
            for (const auto& [name, t] : f.tensors) total += int64_t(t.nbytes());
          for (const std::string& d : dropped) index["weight_map"].erase(d);
          index["metadata"]["total_size"] = total;
          index_text = index.dump(2) + "\n";
        }
      }
    } catch (const json::exception& e) {
      ZT_FAIL(w, " is malformed: ", e.what());
    }
  }

  const fs::path dir(out_dir);
  prepare_out_dir(dir);
  for (const OutFile& f : out) ckpt::write_safetensors((dir / f.name).string(), f.tensors, f.metadata, f.options);
  if (!index_text.empty()) write_text(dir / kIndexFile, index_text);
  write_text(dir / "config.json", config_text);
}

}  // namespace zt::train
