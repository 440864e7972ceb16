// DataLoader: samples of T+1 tokens from a prepared dataset, shuffled
// deterministically per epoch, split across data-parallel ranks, prefetched
// on a background thread, resumable exactly from a saved LoaderState.
//
// Samples. A split's shards are one token stream of N tokens (in index
// order). Sample s (0 <= s < S, S = floor((N - 1) / T)) is tokens
// [s T, s T + T + 1): inputs are its first T tokens, targets its last T. In
// one epoch every token of [0, S T) is an input exactly once (and every
// token of [1, S T] a target exactly once); the tail that does not fill a
// sample is left out.
//
// The stream of samples is defined by (seed, epoch) alone: position i of
// epoch e is sample perm_{seed,e}(i), a bijection of [0, S) (a 4-round
// Feistel network on Philox, cycle-walked into range) for the train split;
// the validation split is read in order (perm = identity). Epochs follow each
// other: stream index q is position q mod S of epoch q div S.
//
// Global batches. A step's global batch is the next G samples of the stream
// (a batch may run into the next epoch). Rank r of dp_size gets rows
// [r G/dp, (r+1) G/dp) of it, in order. next_batch(inputs, targets) with B
// rows hands out this rank's next B rows, so k calls of B/k rows give exactly
// the rows of one call of B rows (gradient accumulation sees the same data),
// and a call may run on into the next global batch. G is set by
// set_global_batch(G) (or LoaderOptions::global_batch); if neither is given
// it is fixed at the first next_batch call as B * dp_size.
//
// Resuming. state() is the position of the next row: (epoch, position) of
// the current global batch's first sample, `row` rows of it already handed
// out to each rank, plus the seed, G, T and the dataset's fingerprint.
// restore() continues with identical batches; it may change dp_size (or G)
// only at a global-batch boundary (row == 0), and adopts the saved seed.
// Every rank has the same state (ranks take rows in lockstep): save it from
// one rank, restore it on all.
//
// Blends. A loader over several prepared datasets (BlendPart: a folder and a
// weight) draws stream position q from dataset i = the one furthest behind
// its share, argmax_i (w_i (q + 1) - n_i) with n_i the samples it gave
// before q (ties: the first listed; w normalised to sum 1): exact
// proportions (|n_i - w_i q| < 1 at every q) in a fixed, interleaved order.
// Dataset i's n-th sample is its own stream's: its own epochs of S_i
// samples, shuffled by (seed of i, epoch) - seed itself for the first, so a
// blend of one dataset is the plain loader, sample for sample - so a
// small dataset repeats (upsampled) while a large one is still in its first
// epoch. The counts n_i at the current global batch's start travel in the
// state (blend_counts) and restore exactly, at any dp size at a boundary.
// Every dataset must come from the same tokenizer. The nominal epoch of a
// blend (samples_per_epoch, state().epoch) is the sum of the S_i.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/blend.h"
#include "data/dataset_index.h"
#include "data/shard.h"

namespace zt::data {

struct LoaderState {
  uint64_t epoch = 0;             // epoch of the current global batch's first sample
  uint64_t position = 0;          // its position within that epoch, [0, samples_per_epoch)
  uint64_t seed = 0;              // the shuffling seed (with epoch: the whole RNG state)
  uint64_t row = 0;               // rows of the current global batch already handed to each rank
  int64_t global_batch = 0;       // G, samples per global batch (0: not fixed yet)
  int64_t seq_len = 0;            // T
  int64_t dp_size = 1;            // data-parallel ranks when saved
  std::string split = "train";
  uint64_t samples_per_epoch = 0;  // S
  std::string dataset;            // DatasetIndex::fingerprint() of the dataset (a blend: each's, and its weight)
  std::vector<uint64_t> blend_counts;  // a blend's n_i at the current global batch's start (empty: one dataset)
};
void to_json(nlohmann::json& j, const LoaderState& s);
void from_json(const nlohmann::json& j, LoaderState& s);  // throws zt::Error naming a missing field

struct LoaderOptions {
  int64_t global_batch = 0;    // G; 0: fixed at the first next_batch as rows * dp_size
  bool verify = true;          // check every shard's checksum and token ids when opening
  int64_t prefetch_rows = 0;   // rows prepared ahead by the background thread; 0: two global
                               // batches' worth of this rank's rows; < 0: no thread
};

// A bijection of [0, n) chosen by (seed, epoch).
class EpochPermutation {
 public:
  EpochPermutation(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t feistel(uint64_t x) const;
  uint64_t n_, seed_, epoch_;
  int half_bits_;
  uint64_t half_mask_;
};

class DataLoader {
 public:
  // Opens DIR (prepared by `zettatron prepare`) and validates index.json and
  // every shard of the split (errors name the file). T >= 1, 0 <= dp_rank < dp_size.
  DataLoader(const std::string& dir, Split split, int64_t T, uint64_t seed, int dp_rank, int dp_size,
             LoaderOptions options = {});
  // A blend of the datasets (one part: the loader above); errors name the
  // folder and the part.
  DataLoader(const std::vector<BlendPart>& parts, Split split, int64_t T, uint64_t seed, int dp_rank, int dp_size,
             LoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // G samples per global batch: a multiple of dp_size, at most samples_per_epoch().
  void set_global_batch(int64_t G);
  int64_t global_batch() const { return G_; }

  // Fills inputs and targets, both (B_local, T) i32 CPU tensors, with this
  // rank's next B_local samples: inputs[b] = sample[0, T), targets[b] = sample[1, T+1).
  void next_batch(const Tensor& inputs, const Tensor& targets);

  LoaderState state() const;
  void restore(const LoaderState& s);
  // Back to epoch 0, position 0 (e.g. to evaluate the validation split from the start).
  void reset();

  int64_t vocab_size() const { return int64_t(sources_[0].index.vocab_size); }
  uint32_t eot_token() const { return sources_[0].index.eot_token; }
  int64_t seq_len() const { return T_; }
  int64_t samples_per_epoch() const { return int64_t(S_); }
  // Input tokens per epoch (S * T; the same number of targets).
  int64_t tokens_per_epoch() const { return int64_t(S_) * T_; }
  const DatasetIndex& index() const { return sources_[0].index; }
  // The blend's datasets in order (one for a plain loader), each's samples
  // handed out to all ranks so far (n_i at the current global batch's start).
  size_t datasets() const { return sources_.size(); }
  const std::vector<uint64_t>& samples_drawn() const { return cursor_.counts; }

 private:
  // One dataset: its shards read as one token stream of S T + tail tokens.
  struct Source {
    std::string dir;
    double weight = 1.0;  // normalised
    DatasetIndex index;
    std::vector<std::unique_ptr<ShardReader>> shards;
    std::vector<uint64_t> shard_first;  // first stream token of each shard (+ the total)
    uint64_t S = 0;
  };
  struct Cursor {
    uint64_t start = 0;  // stream index of the current global batch's first sample
    uint64_t row = 0;    // rows of this rank's slice already taken
    std::vector<uint64_t> counts;  // n_i at `start`, one per dataset
    // This rank's rows of the global batch at `start`: (dataset, its sample
    // number n), and the counts after the batch; made when its first row is
    // taken (plan_batch).
    std::vector<std::pair<uint32_t, uint64_t>> rows;
    std::vector<uint64_t> next_counts;
  };
  void open_source(Source& src) const;
  // Dataset i's sample of number n (its epochs, its shuffle).
  uint64_t sample_of(size_t i, uint64_t n) const;
  void read_sample(const Source& src, uint64_t sample, int32_t* out) const;  // T + 1 tokens
  // Reads the cursor's next row into out (T + 1 tokens) and advances it.
  void take_row(Cursor& c, int32_t* out) const;
  // Advances the cursor one row without reading it.
  std::pair<uint32_t, uint64_t> next_row(Cursor& c) const;
  // Fills c.rows and c.next_counts for the global batch at c.start.
  void plan_batch(Cursor& c) const;
  // The dataset that takes stream position q, given each's samples before it.
  size_t blend_pick(const std::vector<uint64_t>& drawn, uint64_t q) const;
  std::string fingerprint() const;
  void fix_global_batch(int64_t G, const char* how);
  void start_prefetch();
  void stop_prefetch();
  void producer_loop();

  std::string dir_;  // the folder, or the blend's folders joined for messages
  Split split_;
  int64_t T_;
  uint64_t seed_;
  int rank_, dp_;
  LoaderOptions opts_;
  std::vector<Source> sources_;
  uint64_t S_ = 0;  // samples per (nominal) epoch: the sum of the datasets'
  int64_t G_ = 0;
  Cursor cursor_;  // the consumer's position (what state() reports)

  // Background prefetch: rows [head_, tail_) of this rank's row sequence,
  // starting at cursor_, are ready in ring_ (capacity cap_ rows of T + 1).
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable can_produce_, can_consume_;
  std::vector<int32_t> ring_;
  uint64_t cap_ = 0, head_ = 0, tail_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<int32_t> row_buf_;  // no-thread mode
};

}  // namespace zt::data
