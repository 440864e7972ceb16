#include "data/loader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"

namespace zt::data {

// ---- LoaderState <-> JSON -------------------------------------------------

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch},
                     {"position", s.position},
                     {"seed", s.seed},
                     {"row", s.row},
                     {"global_batch", s.global_batch},
                     {"seq_len", s.seq_len},
                     {"dp_size", s.dp_size},
                     {"split", s.split},
                     {"samples_per_epoch", s.samples_per_epoch},
                     {"dataset", s.dataset}};
  if (!s.blend_counts.empty()) j["blend_counts"] = s.blend_counts;
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  ZT_CHECK(j.is_object(), "loader state must be a JSON object");
  auto get = [&](const char* key, auto& out) {
    ZT_CHECK(j.contains(key), "loader state: missing field \"", key, "\"");
    try {
      j.at(key).get_to(out);
    } catch (const nlohmann::json::exception& e) {
      ZT_FAIL("loader state: field \"", key, "\" has the wrong type: ", e.what());
    }
  };
  get("epoch", s.epoch);
  get("position", s.position);
  get("seed", s.seed);
  get("row", s.row);
  get("global_batch", s.global_batch);
  get("seq_len", s.seq_len);
  get("dp_size", s.dp_size);
  get("split", s.split);
  get("samples_per_epoch", s.samples_per_epoch);
  get("dataset", s.dataset);
  s.blend_counts.clear();
  if (j.contains("blend_counts")) get("blend_counts", s.blend_counts);  // a blend's only
}

// ---- EpochPermutation -----------------------------------------------------

EpochPermutation::EpochPermutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n), seed_(seed), epoch_(epoch) {
  ZT_ASSERT(n > 0);
  int bits = 2;
  while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
  bits += bits & 1;  // even: two equal halves
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t(1) << half_bits_) - 1;
}

uint64_t EpochPermutation::feistel(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & half_mask_;
  for (uint32_t round = 0; round < 4; ++round) {
    const PhiloxBlock b = philox4x32_10(uint32_t(r), uint32_t(r >> 32), uint32_t(epoch_),
                                        uint32_t(epoch_ >> 32) ^ (round << 28), uint32_t(seed_),
                                        uint32_t(seed_ >> 32));
    const uint64_t f = (uint64_t(b.w[1]) << 32) | b.w[0];
    const uint64_t nl = r;
    r = (l ^ f) & half_mask_;
    l = nl;
  }
  return (l << half_bits_) | r;
}

uint64_t EpochPermutation::operator()(uint64_t i) const {
  ZT_ASSERT(i < n_);
  uint64_t x = i;
  do {
    x = feistel(x);
  } while (x >= n_);  // cycle-walking: the cycle through i returns into [0, n)
  return x;
}

// ---- DataLoader -----------------------------------------------------------

DataLoader::DataLoader(const std::string& dir, Split split, int64_t T, uint64_t seed, int dp_rank, int dp_size,
                       LoaderOptions options)
    : DataLoader(std::vector<BlendPart>{{dir, 1.0}}, split, T, seed, dp_rank, dp_size, options) {}

DataLoader::DataLoader(const std::vector<BlendPart>& parts, Split split, int64_t T, uint64_t seed, int dp_rank,
                       int dp_size, LoaderOptions options)
    : split_(split), T_(T), seed_(seed), rank_(dp_rank), dp_(dp_size), opts_(options) {
  ZT_CHECK(T >= 1, "DataLoader: sequence length T must be >= 1, got ", T);
  ZT_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "DataLoader: data-parallel rank ", dp_rank,
           " of ", dp_size, " is out of range");
  ZT_CHECK(!parts.empty(), "DataLoader: a blend needs at least one dataset");
  double total = 0.0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ZT_CHECK(parts[i].weight > 0.0 && std::isfinite(parts[i].weight), "dataset ", i + 1, " of the blend ('",
             parts[i].dir, "') has weight ", parts[i].weight, "; every weight must be a positive number");
    total += parts[i].weight;
  }
  sources_.resize(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    Source& src = sources_[i];
    src.dir = parts[i].dir;
    src.weight = parts[i].weight / total;
    open_source(src);
    const DatasetIndex& a = sources_[0].index;
    ZT_CHECK(src.index.tokenizer_fingerprint == a.tokenizer_fingerprint && src.index.vocab_size == a.vocab_size,
             "dataset '", src.dir, "' was prepared with tokenizer ", src.index.tokenizer_name, " (",
             src.index.vocab_size, " ids, fingerprint ", src.index.tokenizer_fingerprint, ") but '",
             sources_[0].dir, "' with ", a.tokenizer_name, " (", a.vocab_size, " ids, fingerprint ",
             a.tokenizer_fingerprint, "): a blend's datasets must share one tokenizer; prepare them with the same "
             "--tokenizer");
    S_ += src.S;
    dir_ += (i == 0 ? "" : " + ") + src.dir;
  }
  cursor_.counts.assign(sources_.size(), 0);
  if (opts_.global_batch > 0) fix_global_batch(opts_.global_batch, "LoaderOptions::global_batch");
}

void DataLoader::open_source(Source& src) const {
  const std::string& dir = src.dir;
  src.index = DatasetIndex::load(dir);
  const SplitInfo& info = src.index.split(split_);
  ZT_CHECK(!info.shards.empty(), "dataset '", dir, "' has no ", split_name(split_), " split",
           split_ == Split::val ? " (prepared with --val-fraction 0?)" : "");
  uint64_t first = 0;
  for (const ShardInfo& sh : info.shards) {
    const std::string path = dir + "/" + sh.file;
    auto reader = std::make_unique<ShardReader>(path, uint32_t(src.index.vocab_size), opts_.verify);
    const ShardHeader& h = reader->header();
    ZT_CHECK(h.token_count == sh.tokens && h.checksum == sh.checksum && h.token_bytes == src.index.token_bytes,
             "shard '", path, "' does not match index.json (index: ", sh.tokens, " tokens, checksum ",
             hex64(sh.checksum), "; file: ", h.token_count, " tokens, checksum ", hex64(h.checksum),
             "): the folder mixes files of different runs of prepare");
    src.shard_first.push_back(first);
    first += h.token_count;
    src.shards.push_back(std::move(reader));
  }
  src.shard_first.push_back(first);
  ZT_CHECK(first >= uint64_t(T_) + 1, "dataset '", dir, "': the ", split_name(split_), " split has ", first,
           " tokens, too few for one sample of T+1 = ", T_ + 1, " tokens");
  src.S = (first - 1) / uint64_t(T_);
}

DataLoader::~DataLoader() { stop_prefetch(); }

void DataLoader::fix_global_batch(int64_t G, const char* how) {
  ZT_CHECK(G >= 1 && G % dp_ == 0, "DataLoader: the global batch (", how, " = ", G,
           ") must be a positive multiple of the data-parallel size ", dp_);
  ZT_CHECK(uint64_t(G) <= S_, "dataset '", dir_, "' is too small for one global batch: the ", split_name(split_),
           " split has ", S_, " samples of T+1 = ", T_ + 1, " tokens per epoch, the global batch is ", G,
           " samples (", how, ")");
  G_ = G;
}

void DataLoader::set_global_batch(int64_t G) {
  if (G == G_) return;
  ZT_CHECK(cursor_.row == 0, "DataLoader::set_global_batch: cannot change the global batch in the middle of one (",
           cursor_.row, " rows of it already taken)");
  stop_prefetch();
  fix_global_batch(G, "set_global_batch");
  cursor_.rows.clear();  // planned for the old G
}

uint64_t DataLoader::sample_of(size_t i, uint64_t n) const {
  const uint64_t S = sources_[i].S, epoch = n / S, pos = n % S;
  if (split_ == Split::val) return pos;
  // The first dataset shuffles by the seed itself (a blend of one is the
  // plain loader); the others by seeds of their own.
  const uint64_t seed = i == 0 ? seed_ : seed_ ^ (0x9E3779B97F4A7C15ull * uint64_t(i));
  return EpochPermutation(S, seed, epoch)(pos);
}

void DataLoader::read_sample(const Source& src, uint64_t sample, int32_t* out) const {
  uint64_t t = sample * uint64_t(T_);
  uint64_t left = uint64_t(T_) + 1;
  size_t k = size_t(std::upper_bound(src.shard_first.begin(), src.shard_first.end(), t) - src.shard_first.begin()) - 1;
  while (left > 0) {
    ZT_ASSERT(k < src.shards.size());
    const uint64_t off = t - src.shard_first[k];
    const uint64_t n = std::min(left, src.shards[k]->tokens() - off);
    src.shards[k]->read(off, n, out);
    out += n;
    t += n;
    left -= n;
    ++k;
  }
}

void DataLoader::plan_batch(Cursor& c) const {
  const uint64_t per = uint64_t(G_ / dp_), first = uint64_t(rank_) * per;
  c.rows.clear();
  c.rows.reserve(per);
  if (sources_.size() == 1) {
    for (uint64_t j = 0; j < per; ++j) c.rows.emplace_back(0u, c.start + first + j);
    c.next_counts = {c.start + uint64_t(G_)};
    return;
  }
  // The dataset furthest behind its share takes each of the batch's G
  // positions in order, from the counts at its start (the cursor's).
  c.next_counts = c.counts;
  for (uint64_t j = 0; j < uint64_t(G_); ++j) {
    const size_t i = blend_pick(c.next_counts, c.start + j);
    if (j >= first && j < first + per) c.rows.emplace_back(uint32_t(i), c.next_counts[i]);
    ++c.next_counts[i];
  }
}

size_t DataLoader::blend_pick(const std::vector<uint64_t>& drawn, uint64_t q) const {
  const double q1 = double(q + 1);
  size_t best = 0;
  double best_deficit = -INFINITY;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const double deficit = sources_[i].weight * q1 - double(drawn[i]);
    if (deficit > best_deficit) {  // ties: the first listed
      best = i;
      best_deficit = deficit;
    }
  }
  return best;
}

std::pair<uint32_t, uint64_t> DataLoader::next_row(Cursor& c) const {
  if (c.rows.empty()) plan_batch(c);
  const std::pair<uint32_t, uint64_t> r = c.rows[size_t(c.row)];
  if (++c.row == uint64_t(G_ / dp_)) {
    c.counts = c.next_counts;
    c.start += uint64_t(G_);
    c.row = 0;
    c.rows.clear();
  }
  return r;
}

void DataLoader::take_row(Cursor& c, int32_t* out) const {
  const auto [i, n] = next_row(c);
  read_sample(sources_[i], sample_of(i, n), out);
}

void DataLoader::start_prefetch() {
  if (opts_.prefetch_rows < 0 || thread_.joinable()) return;
  const uint64_t per = uint64_t(G_ / dp_);
  cap_ = opts_.prefetch_rows > 0 ? uint64_t(opts_.prefetch_rows) : std::max<uint64_t>(2 * per, 1);
  ring_.assign(cap_ * uint64_t(T_ + 1), 0);
  head_ = tail_ = 0;
  stop_ = false;
  error_ = nullptr;
  thread_ = std::thread([this] { producer_loop(); });
}

void DataLoader::stop_prefetch() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  can_produce_.notify_all();
  thread_.join();
  head_ = tail_ = 0;
}

void DataLoader::producer_loop() {
  Cursor c = cursor_;  // the row after the last one the consumer took
  const size_t row_len = size_t(T_ + 1);
  try {
    while (true) {
      uint64_t slot;
      {
        std::unique_lock<std::mutex> lock(mu_);
        can_produce_.wait(lock, [&] { return stop_ || tail_ - head_ < cap_; });
        if (stop_) return;
        slot = tail_ % cap_;
      }
      take_row(c, ring_.data() + slot * row_len);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++tail_;
      }
      can_consume_.notify_one();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    can_consume_.notify_all();
  }
}

void DataLoader::next_batch(const Tensor& inputs, const Tensor& targets) {
  for (const Tensor* t : {&inputs, &targets}) {
    const char* name = t == &inputs ? "inputs" : "targets";
    ZT_CHECK(t->defined(), "DataLoader::next_batch: '", name, "' is undefined");
    ZT_CHECK(t->device().is_cpu(), "DataLoader::next_batch: '", name, "' is ", t->str(), "; a CPU tensor is required");
    ZT_CHECK(t->dtype() == DType::i32 && t->ndim() == 2 && t->size(1) == T_ && t->size(0) >= 1,
             "DataLoader::next_batch: '", name, "' is ", t->str(), " but i32(B, ", T_, ") is required");
  }
  ZT_CHECK(inputs.shape() == targets.shape(), "DataLoader::next_batch: 'inputs' ", inputs.str(), " and 'targets' ",
           targets.str(), " must have the same shape");
  ZT_CHECK(!inputs.overlaps(targets), "DataLoader::next_batch: 'inputs' and 'targets' overlap");
  const int64_t B = inputs.size(0);
  if (G_ == 0) fix_global_batch(B * dp_, "rows of the first next_batch call x dp_size");
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  const size_t row_len = size_t(T_ + 1);
  auto emit = [&](int64_t b, const int32_t* row) {
    std::memcpy(in + b * T_, row, size_t(T_) * 4);
    std::memcpy(tg + b * T_, row + 1, size_t(T_) * 4);
  };
  if (opts_.prefetch_rows < 0) {
    row_buf_.resize(row_len);
    for (int64_t b = 0; b < B; ++b) {
      take_row(cursor_, row_buf_.data());
      emit(b, row_buf_.data());
    }
    return;
  }
  start_prefetch();
  for (int64_t b = 0; b < B; ++b) {
    uint64_t slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      can_consume_.wait(lock, [&] { return head_ < tail_ || error_; });
      if (head_ == tail_ && error_) std::rethrow_exception(error_);
      slot = head_ % cap_;
    }
    emit(b, ring_.data() + slot * row_len);
    next_row(cursor_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++head_;
    }
    can_produce_.notify_one();
  }
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.epoch = cursor_.start / S_;
  s.position = cursor_.start % S_;
  s.seed = seed_;
  s.row = cursor_.row;
  s.global_batch = G_;
  s.seq_len = T_;
  s.dp_size = dp_;
  s.split = split_name(split_);
  s.samples_per_epoch = S_;
  s.dataset = fingerprint();
  if (sources_.size() > 1) s.blend_counts = cursor_.counts;
  return s;
}

std::string DataLoader::fingerprint() const {
  if (sources_.size() == 1) return sources_[0].index.fingerprint();
  std::string out;
  for (const Source& src : sources_) {
    char w[32];
    std::snprintf(w, sizeof w, "%.17g", src.weight);
    out += (out.empty() ? "" : " + ") + src.index.fingerprint() + " x " + w;
  }
  return out;
}

void DataLoader::restore(const LoaderState& s) {
  ZT_CHECK(s.split == split_name(split_), "DataLoader::restore: the state is for the ", s.split,
           " split, this loader reads ", split_name(split_));
  ZT_CHECK(s.seq_len == T_, "DataLoader::restore: the state has sequence length ", s.seq_len,
           ", this loader has T = ", T_, " (samples would differ)");
  ZT_CHECK(s.dataset == fingerprint() && s.samples_per_epoch == S_, "DataLoader::restore: the state was saved on a different dataset (fingerprint ",
           s.dataset, ", ", s.samples_per_epoch, " samples per epoch) than '", dir_, "' (fingerprint ",
           fingerprint(), ", ", S_, " samples per epoch)");
  ZT_CHECK(s.position < S_, "DataLoader::restore: position ", s.position, " is not below samples_per_epoch ", S_);
  int64_t G = s.global_batch;
  if (s.row != 0) {
    ZT_CHECK(s.dp_size == dp_, "DataLoader::restore: the state is ", s.row, " rows into a global batch of ",
             s.dp_size, " data-parallel ranks; resuming with ", dp_,
             " ranks is only possible at a global-batch boundary");
    ZT_CHECK(G > 0 && (G_ == 0 || G_ == G), "DataLoader::restore: the state is in the middle of a global batch of ",
             G, " samples; this loader's global batch is ", G_);
    ZT_CHECK(s.row < uint64_t(G / dp_), "DataLoader::restore: row ", s.row, " is outside a rank's ", G / dp_,
             " rows");
  }
  const uint64_t start = s.epoch * S_ + s.position;
  uint64_t drawn = 0;
  for (uint64_t n : s.blend_counts) drawn += n;
  ZT_CHECK(sources_.size() == 1 ? s.blend_counts.empty() : (s.blend_counts.size() == sources_.size() && drawn == start),
           "DataLoader::restore: the state's blend_counts (", s.blend_counts.size(), " counts, ", drawn,
           " samples) do not fit a blend of ", sources_.size(), " datasets at stream position ", start);
  stop_prefetch();
  if (G_ == 0 && G > 0) fix_global_batch(G, "restored state");
  seed_ = s.seed;
  cursor_.start = start;
  cursor_.row = s.row;
  cursor_.counts = sources_.size() == 1 ? std::vector<uint64_t>{start} : s.blend_counts;
  cursor_.rows.clear();
}

void DataLoader::reset() {
  stop_prefetch();
  cursor_ = Cursor{};
  cursor_.counts.assign(sources_.size(), 0);
}

}  // namespace zt::data
