#include "data/tokenizer.h"


#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "data/bpe.h"
#include "core/hash.h"
#include "data/unicode.h"

namespace zt::data {
namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  ZT_CHECK(f.good(), what, " '", path, "' cannot be opened: ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  ZT_CHECK(!f.bad(), what, " '", path, "' could not be read");
  return std::move(ss).str();
}

// GPT-2's byte alphabet: bytes that are printable and not a space map to
// themselves as code points; the other 68 map to U+0100.. in byte order.
struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code point -> byte, -1 if none
  ByteAlphabet() {
    to_byte.fill(-1);
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      to_cp[size_t(b)] = printable(b) ? uint32_t(b) : uint32_t(256 + n++);
      to_byte[to_cp[size_t(b)]] = int16_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// memcmp for the short keys of the caches (a libc call costs more than the compare).
inline bool same_bytes(const char* a, const char* b, size_t n) {
  if (n > 16) return std::memcmp(a, b, n) == 0;
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// bytes -> id for the mergeable tokens (ids index `tokens`).
class BytesIndex {
 public:
  void build(const std::vector<std::string>& tokens, const std::vector<uint8_t>& skip) {
    size_t cap = 16;
    while (cap < tokens.size() * 2) cap *= 2;
    slots_.assign(cap, kEmpty);
    mask_ = cap - 1;
    tokens_ = &tokens;
    for (uint32_t id = 0; id < tokens.size(); ++id) {
      if (skip[id]) continue;
      const std::string& t = tokens[id];
      size_t i = hash_bytes(t.data(), t.size()) & mask_;
      while (slots_[i] != kEmpty) i = (i + 1) & mask_;
      slots_[i] = id;
    }
  }
  std::optional<uint32_t> find(const char* p, size_t n) const {
    for (size_t i = hash_bytes(p, n) & mask_;; i = (i + 1) & mask_) {
      const uint32_t id = slots_[i];
      if (id == kEmpty) return std::nullopt;
      const std::string& t = (*tokens_)[id];
      if (t.size() == n && same_bytes(t.data(), p, n)) return id;
    }
  }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
  const std::vector<std::string>* tokens_ = nullptr;
};

// Recently seen pieces -> their tokens, one per thread. Bounded: when full
// at its largest size it starts afresh.
class WordCache {
 public:
  static constexpr size_t kMaxKeyBytes = 255;

  const uint32_t* find(const char* p, size_t n, uint64_t h, uint32_t* count) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return nullptr;
      if (s.hash == h && s.key_len == n && same_bytes(keys_.data() + s.key_off, p, n)) {
        *count = s.val_len;
        return vals_.data() + s.val_off;
      }
    }
  }

  void insert(const char* p, size_t n, uint64_t h, const uint32_t* ids, size_t count) {
    if (n > kMaxKeyBytes || count > 0xFFFF) return;
    if ((used_ + 1) * 2 > slots_.size()) {
      if (slots_.size() >= kMaxSlots) {
        clear();
      } else {
        rehash(std::max<size_t>(slots_.size() * 2, 4096));
      }
    }
    Slot s{h, uint32_t(keys_.size()), uint32_t(vals_.size()), uint16_t(n), uint16_t(count)};
    keys_.append(p, n);
    vals_.insert(vals_.end(), ids, ids + count);
    place(s);
    ++used_;
  }

 private:
  static constexpr size_t kMaxSlots = size_t(1) << 18;
  struct Slot {
    uint64_t hash;  // 0: empty
    uint32_t key_off, val_off;
    uint16_t key_len, val_len;
  };
  void place(const Slot& s) {
    size_t i = s.hash & mask_;
    while (slots_[i].hash != 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
  void rehash(size_t cap) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    keys_.reserve(cap * 4);  // about the average piece length at the largest fill
    vals_.reserve(cap);
    for (const Slot& s : old)
      if (s.hash) place(s);
  }
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    vals_.clear();
    used_ = 0;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, used_ = 0;
  std::string keys_;
  std::vector<uint32_t> vals_;
};

struct ThreadState {
  WordCache cache;
  detail::MergeWorkspace ws;
  std::vector<uint32_t> ids;
};

std::vector<std::string> llama3_special_names() {
  std::vector<std::string> v = {"begin_of_text",         "end_of_text",     "reserved_special_token_0",
                                "reserved_special_token_1", "finetune_right_pad_id", "reserved_special_token_2",
                                "start_header_id",       "end_header_id",   "eom_id",
                                "eot_id",                "python_tag"};
  for (int i = 3; i <= 247; ++i) v.push_back("reserved_special_token_" + std::to_string(i));
  return v;
}

std::string trim_cr(std::string_view s) {
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return std::string(s);
}

bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[size_t(uint8_t(a[i]))] = int8_t(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') ++pad;
  if (in.size() >= 2 && in[in.size() - 2] == '=') ++pad;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      int d;
      if (c == '=' && i + 4 == in.size() && k >= 4 - pad) {
        d = 0;
      } else {
        d = table[size_t(uint8_t(c))];
        if (d < 0) return false;
      }
      v = (v << 6) | uint32_t(d);
    }
    out.push_back(char(v >> 16));
    out.push_back(char((v >> 8) & 0xFF));
    out.push_back(char(v & 0xFF));
  }
  out.resize(out.size() - pad);
  return true;
}

}  // namespace

struct Tokenizer::Impl {
  std::string name;
  Pattern pattern = Pattern::gpt2;
  bool whole_piece_lookup = false;  // tiktoken: a piece that is a token is emitted whole
  std::vector<std::string> tokens;  // id -> bytes (special: its text)
  std::vector<uint8_t> is_special;  // id -> 1 for special tokens
  std::array<uint32_t, 256> byte_id{};
  detail::PairTable pairs;
  BytesIndex index;
  std::vector<SpecialToken> specials;
  std::array<uint8_t, 256> special_first{};  // first bytes of special-token texts
  uint32_t eot = 0;
  std::string fingerprint;

  mutable std::mutex mu;
  mutable std::unordered_map<std::thread::id, std::unique_ptr<ThreadState>> states;

  // Each tokenizer has an id never reused in the process, so a thread can
  // remember its state for the tokenizer it used last without a lookup (an
  // id that matches belongs to a tokenizer that is alive: it is being called).
  const uint64_t uid = next_uid();
  static uint64_t next_uid() {
    static std::atomic<uint64_t> n{1};
    return n++;
  }

  ThreadState& state() const {
    thread_local uint64_t last_uid = 0;
    thread_local ThreadState* last = nullptr;
    if (last_uid == uid) return *last;
    std::lock_guard<std::mutex> lock(mu);
    auto& s = states[std::this_thread::get_id()];
    if (!s) s = std::make_unique<ThreadState>();
    last_uid = uid;
    last = s.get();
    return *s;
  }

  void encode_piece(ThreadState& ts, const char* p, size_t n, std::vector<uint32_t>& out) const {
    if (n == 1) {
      out.push_back(byte_id[uint8_t(p[0])]);
      return;
    }
    if (whole_piece_lookup) {
      if (auto id = index.find(p, n)) {
        out.push_back(*id);
        return;
      }
    }
    const uint64_t h = hash_bytes(p, n) | 1;
    uint32_t count = 0;
    if (const uint32_t* hit = ts.cache.find(p, n, h, &count)) {
      for (uint32_t i = 0; i < count; ++i) out.push_back(hit[i]);  // mostly 1-3 ids: no memmove call
      return;
    }
    ts.ids.resize(n);
    for (size_t i = 0; i < n; ++i) ts.ids[i] = byte_id[uint8_t(p[i])];
    detail::bpe_merge(pairs, ts.ids, ts.ws);
    out.insert(out.end(), ts.ids.begin(), ts.ids.end());
    ts.cache.insert(p, n, h, ts.ids.data(), ts.ids.size());
  }

  void encode_ordinary(ThreadState& ts, std::string_view text, std::vector<uint32_t>& out) const {
    const char* s = text.data();
    const size_t n = text.size();
    size_t pos = 0;
    while (pos < n) {
      const size_t end = next_piece(pattern, s, n, pos);
      encode_piece(ts, s + pos, end - pos, out);
      pos = end;
    }
  }

  // Builds everything derived from tokens / specials / pairs; checks the byte tokens.
  void finish(const std::string& path) {
    for (const SpecialToken& s : specials) {
      special_first[uint8_t(s.text[0])] = 1;
      is_special[s.id] = 1;
    }
    index.build(tokens, is_special);
    for (int b = 0; b < 256; ++b) {
      const char c = char(b);
      auto id = index.find(&c, 1);
      ZT_CHECK(id.has_value(), "tokenizer file '", path, "' has no token for the byte 0x", std::hex, b,
               ": a byte-level BPE vocabulary needs all 256");
      byte_id[size_t(b)] = *id;
    }
    // Fingerprint: pattern, flags, tokens in id order, merges in rank order, specials.
    std::string buf;
    buf += pattern == Pattern::gpt2 ? "gpt2-pattern;" : "llama3-pattern;";
    buf += whole_piece_lookup ? "whole;" : "merge;";
    uint64_t h = hash_bytes(buf.data(), buf.size());
    for (const std::string& t : tokens) h = mix64(h ^ hash_bytes(t.data(), t.size(), t.size()));
    std::vector<detail::PairTable::Entry> merges;
    for (const auto& e : pairs.slots())
      if (e.key != detail::PairTable::kEmpty) merges.push_back(e);
    std::sort(merges.begin(), merges.end(),
              [](const auto& a, const auto& b) { return a.rank != b.rank ? a.rank < b.rank : a.key < b.key; });
    for (const auto& e : merges) h = mix64(h ^ e.key) ^ mix64((uint64_t(e.rank) << 32) | e.merged);
    for (const SpecialToken& s : specials) h = mix64(h ^ s.id) ^ hash_bytes(s.text.data(), s.text.size());
    fingerprint = hex64(mix64(h ^ eot));
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gpt2_files(const std::string& encoder_json_path,
                                                      const std::string& vocab_bpe_path, const std::string& name) {
  auto m = std::make_unique<Impl>();
  m->name = name;
  m->pattern = Pattern::gpt2;
  m->whole_piece_lookup = false;

  // encoder.json: {"token string": id, ...}
  const std::string json_text = read_file(encoder_json_path, "tokenizer file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    ZT_FAIL("tokenizer file '", encoder_json_path, "' is not valid JSON: ", e.what());
  }
  ZT_CHECK(j.is_object() && !j.empty(), "tokenizer file '", encoder_json_path,
           "' must be a JSON object mapping token strings to ids");
  const size_t n = j.size();
  m->tokens.assign(n, std::string());
  m->is_special.assign(n, 0);
  std::vector<uint8_t> seen(n, 0);
  std::unordered_map<std::string, uint32_t> by_key;
  by_key.reserve(n * 2);
  const ByteAlphabet& ab = alphabet();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    ZT_CHECK(it->is_number_unsigned() && it->get<uint64_t>() < n, "tokenizer file '", encoder_json_path,
             "': the id of token \"", key, "\" must be an integer in [0, ", n, ") (one id per entry)");
    const uint32_t id = it->get<uint32_t>();
    ZT_CHECK(!seen[id], "tokenizer file '", encoder_json_path, "': id ", id, " is used by two tokens");
    seen[id] = 1;
    by_key.emplace(key, id);
    if (key == "<|endoftext|>" || key == "<|startoftext|>") {
      m->specials.push_back({key, id});
      m->tokens[id] = key;
      continue;
    }
    std::string bytes;
    const auto* p = reinterpret_cast<const unsigned char*>(key.data());
    for (size_t i = 0; i < key.size();) {
      const Utf8Char c = decode_utf8(p + i, key.size() - i);
      ZT_CHECK(c.cp < ab.to_byte.size() && ab.to_byte[c.cp] >= 0 && !(c.len == 1 && c.cp >= 0x80),
               "tokenizer file '", encoder_json_path, "': token \"", key, "\" (id ", id, ") has the character U+",
               std::hex, c.cp, ", which is not in GPT-2's byte alphabet");
      bytes.push_back(char(ab.to_byte[c.cp]));
      i += c.len;
    }
    m->tokens[id] = std::move(bytes);
  }
  auto eot = std::find_if(m->specials.begin(), m->specials.end(),
                          [](const SpecialToken& s) { return s.text == "<|endoftext|>"; });
  ZT_CHECK(eot != m->specials.end(), "tokenizer file '", encoder_json_path, "' has no <|endoftext|> token");
  m->eot = eot->id;

  // vocab.bpe: "#version..." then one merge "left right" per line, in rank order.
  const std::string bpe_text = read_file(vocab_bpe_path, "tokenizer file");
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos <= bpe_text.size();) {
    size_t e = bpe_text.find('\n', pos);
    if (e == std::string::npos) e = bpe_text.size();
    lines.emplace_back(bpe_text.data() + pos, e - pos);
    pos = e + 1;
  }
  m->pairs.reserve(n);
  uint32_t rank = 0;
  for (size_t ln = 0; ln < lines.size(); ++ln) {
    const std::string line = trim_cr(lines[ln]);
    if (line.empty() || (ln == 0 && line[0] == '#')) continue;
    const size_t sp = line.find(' ');
    ZT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
             "tokenizer file '", vocab_bpe_path, "' line ", ln + 1, ": expected two tokens separated by one space, got \"",
             line, "\"");
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    auto ia = by_key.find(a), ib = by_key.find(b), iab = by_key.find(a + b);
    ZT_CHECK(ia != by_key.end() && ib != by_key.end(), "tokenizer file '", vocab_bpe_path, "' line ", ln + 1,
             ": \"", ia == by_key.end() ? a : b, "\" is not a token of ", encoder_json_path);
    ZT_CHECK(iab != by_key.end(), "tokenizer file '", vocab_bpe_path, "' line ", ln + 1, ": the merged token \"",
             a + b, "\" is not in ", encoder_json_path);
    ZT_CHECK(m->pairs.insert(ia->second, ib->second, rank, iab->second), "tokenizer file '", vocab_bpe_path,
             "' line ", ln + 1, ": the merge \"", line, "\" appears twice");
    ++rank;
  }
  ZT_CHECK(rank > 0, "tokenizer file '", vocab_bpe_path, "' has no merges");
  m->finish(encoder_json_path);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(m)));
}

std::unique_ptr<Tokenizer> Tokenizer::from_tiktoken_file(const std::string& path, const std::string& name) {
  auto m = std::make_unique<Impl>();
  m->name = name;
  m->pattern = Pattern::llama3;
  m->whole_piece_lookup = true;

  const std::string text = read_file(path, "tokenizer file");
  std::vector<std::pair<uint64_t, std::string>> ranked;  // (rank, bytes)
  std::string bytes;
  size_t ln = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    ++ln;
    const std::string line = trim_cr(std::string_view(text).substr(pos, e - pos));
    pos = e + 1;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    ZT_CHECK(sp != std::string::npos, "tokenizer file '", path, "' line ", ln,
             ": expected \"<base64 token> <rank>\" (a tiktoken rank file)");
    ZT_CHECK(base64_decode(std::string_view(line).substr(0, sp), bytes), "tokenizer file '", path, "' line ", ln,
             ": \"", line.substr(0, sp), "\" is not valid base64");
    const std::string r = line.substr(sp + 1);
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(r.c_str(), &end, 10);
    ZT_CHECK(!r.empty() && std::isdigit(uint8_t(r[0])) && end && *end == '\0' && errno == 0 && v < (1ull << 31),
             "tokenizer file '", path, "' line ", ln, ": the rank \"", r, "\" is not a non-negative integer");
    ranked.emplace_back(v, bytes);
  }
  ZT_CHECK(!ranked.empty(), "tokenizer file '", path, "' has no tokens (empty or not a tiktoken rank file)");
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < ranked.size(); ++i) {
    ZT_CHECK(ranked[i].first >= i, "tokenizer file '", path, "': rank ", ranked[i].first, " appears twice");
    ZT_CHECK(ranked[i].first == i, "tokenizer file '", path, "': ranks must be 0..", ranked.size() - 1,
             " with none missing; rank ", i, " is missing");
  }
  const uint32_t base = uint32_t(ranked.size());
  const auto names = llama3_special_names();
  m->tokens.reserve(base + names.size());
  for (auto& [r, b] : ranked) m->tokens.push_back(std::move(b));
  for (size_t i = 0; i < names.size(); ++i) {
    m->specials.push_back({"<|" + names[i] + "|>", base + uint32_t(i)});
    m->tokens.push_back(m->specials.back().text);
  }
  m->is_special.assign(m->tokens.size(), 0);
  m->eot = base + 1;  // <|end_of_text|>

  // Detect duplicate byte strings, then derive the pair table.
  {
    std::vector<uint8_t> none(m->tokens.size(), 0);
    for (size_t i = base; i < m->tokens.size(); ++i) none[i] = 1;
    m->index.build(m->tokens, none);
    for (uint32_t id = 0; id < base; ++id) {
      const std::string& t = m->tokens[id];
      const uint32_t found = m->index.find(t.data(), t.size()).value_or(id);
      ZT_CHECK(found == id, "tokenizer file '", path, "': ranks ", std::min(found, id), " and ",
               std::max(found, id), " have the same bytes");
    }
  }
  m->pairs.reserve(base * 3);
  for (uint32_t id = 0; id < base; ++id) {
    const std::string& t = m->tokens[id];
    for (size_t k = 1; k < t.size(); ++k) {
      const auto x = m->index.find(t.data(), k);
      if (!x) continue;
      const auto y = m->index.find(t.data() + k, t.size() - k);
      if (!y) continue;
      m->pairs.insert(*x, *y, id, id);
    }
  }
  m->finish(path);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(m)));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<uint32_t>& out) const {
  impl_->encode_ordinary(impl_->state(), text, out);
}

std::vector<uint32_t> Tokenizer::encode_with_special(std::string_view text) const {
  const Impl& m = *impl_;
  ThreadState& ts = m.state();
  std::vector<uint32_t> out;
  size_t start = 0;  // text not yet encoded
  for (size_t i = 0; i < text.size(); ++i) {
    if (!m.special_first[uint8_t(text[i])]) continue;
    const SpecialToken* best = nullptr;
    for (const SpecialToken& s : m.specials)
      if (text.compare(i, s.text.size(), s.text) == 0 && (!best || s.text.size() > best->text.size())) best = &s;
    if (!best) continue;
    m.encode_ordinary(ts, text.substr(start, i - start), out);
    out.push_back(best->id);
    i += best->text.size() - 1;
    start = i + 1;
  }
  m.encode_ordinary(ts, text.substr(start), out);
  return out;
}

std::vector<uint32_t> Tokenizer::encode_parallel(std::string_view text, int threads) const {
  const size_t n = text.size();
  if (threads <= 1 || n < (size_t(1) << 16)) return encode(text);
  // Cut into about 8 parts per thread, each cut moved forward to the next
  // position where every pattern ends a piece (see is_piece_boundary).
  const size_t parts = size_t(threads) * 8;
  const size_t step = n / parts;
  std::vector<size_t> cuts{0};
  for (size_t k = 1; k < parts; ++k) {
    size_t p = std::max(k * step, cuts.back() + 1);
    const size_t limit = std::min(n, p + step);
    while (p < limit && !is_piece_boundary(text.data(), n, p)) ++p;
    if (p < limit) cuts.push_back(p);
  }
  cuts.push_back(n);
  const size_t m = cuts.size() - 1;
  std::vector<std::vector<uint32_t>> out(m);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (size_t k = 0; k < m; ++k) out[k] = encode(text.substr(cuts[k], cuts[k + 1] - cuts[k]));
  size_t total = 0;
  for (const auto& v : out) total += v.size();
  std::vector<uint32_t> ids;
  ids.reserve(total);
  for (const auto& v : out) ids.insert(ids.end(), v.begin(), v.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  const Impl& m = *impl_;
  size_t bytes = 0;
  for (uint32_t id : ids) {
    ZT_CHECK(id < m.tokens.size(), "decode: token id ", id, " is outside the vocabulary of '", m.name, "' (size ",
             m.tokens.size(), ")");
    bytes += m.tokens[id].size();
  }
  std::string out;
  out.reserve(bytes);
  for (uint32_t id : ids) out += m.tokens[id];
  return out;
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  ZT_CHECK(id < impl_->tokens.size(), "token id ", id, " is outside the vocabulary of '", impl_->name, "' (size ",
           impl_->tokens.size(), ")");
  return impl_->tokens[id];
}

size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }
uint32_t Tokenizer::eot_token() const { return impl_->eot; }
std::string Tokenizer::name() const { return impl_->name; }
Pattern Tokenizer::pattern() const { return impl_->pattern; }
const std::vector<SpecialToken>& Tokenizer::special_tokens() const { return impl_->specials; }
std::string Tokenizer::fingerprint() const { return impl_->fingerprint; }
const detail::PairTable& Tokenizer::merge_table() const { return impl_->pairs; }
uint32_t Tokenizer::byte_token(uint8_t b) const { return impl_->byte_id[b]; }

std::optional<uint32_t> Tokenizer::special_token_id(std::string_view text) const {
  for (const SpecialToken& s : impl_->specials)
    if (s.text == text) return s.id;
  return std::nullopt;
}

std::string cache_dir() {
  if (const char* d = std::getenv("ZT_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/zettatron";
  const char* home = std::getenv("HOME");
  ZT_CHECK(home && *home, "cannot find the cache folder: set ZT_CACHE_DIR (or HOME)");
  return std::string(home) + "/.cache/zettatron";
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_path) {
  const std::string fix = "run `make deps` (scripts/fetch_vocab.sh) to fetch it, or pass --tokenizer PATH";
  if (name_or_path == "gpt2") {
    const std::string dir = cache_dir() + "/tokenizers/gpt2";
    for (const char* f : {"encoder.json", "vocab.bpe"})
      ZT_CHECK(fs::exists(dir + "/" + f), "GPT-2 tokenizer file ", dir, "/", f, " not found: ", fix);
    return Tokenizer::from_gpt2_files(dir + "/encoder.json", dir + "/vocab.bpe", "gpt2");
  }
  if (name_or_path == "llama3") {
    const std::string file = cache_dir() + "/tokenizers/llama3/llama3.tiktoken";
    ZT_CHECK(fs::exists(file), "Llama 3 tokenizer file ", file, " not found: ", fix);
    return Tokenizer::from_tiktoken_file(file, "llama3");
  }
  const fs::path p(name_or_path);
  std::error_code ec;
  ZT_CHECK(fs::exists(p, ec), "unknown tokenizer '", name_or_path,
           "': expected gpt2, llama3, a directory with encoder.json + vocab.bpe, or a tiktoken rank file");
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "encoder.json") && fs::exists(p / "vocab.bpe"))
      return Tokenizer::from_gpt2_files((p / "encoder.json").string(), (p / "vocab.bpe").string(), name_or_path);
    if (fs::exists(p / "tokenizer.model")) return Tokenizer::from_tiktoken_file((p / "tokenizer.model").string(), name_or_path);
    std::vector<fs::path> ranks;
    for (const auto& e : fs::directory_iterator(p))
      if (e.path().extension() == ".tiktoken") ranks.push_back(e.path());
    ZT_CHECK(ranks.size() == 1, "tokenizer directory '", name_or_path,
             "' must hold encoder.json + vocab.bpe (GPT-2 format), tokenizer.model, or exactly one *.tiktoken file");
    return Tokenizer::from_tiktoken_file(ranks[0].string(), name_or_path);
  }
  ZT_CHECK(p.filename() != "encoder.json" && p.extension() != ".bpe", "tokenizer '", name_or_path,
           "': pass the directory that holds encoder.json and vocab.bpe, not one of the files");
  return Tokenizer::from_tiktoken_file(name_or_path, name_or_path);
}

}  // namespace zt::data
