// Choosing among kernels that write the same bits by timing them on the
// calls training makes anyway: no extra work, no copy of the inputs, and no
// host synchronisation (a call's time is read from its events on a later
// call, once they have completed). Which kernel is fastest for a shape
// depends on the GPU (the classifier's rows in flight per SM ran at 31% of
// an H200's copy rate where the H100 had measured 93% at another setting:
// bench/results/gpu-2026-11-27.md); a race settles it on the machine that
// runs, and since every candidate writes the same bits the choice changes no
// result, so it runs in deterministic training too. Host-only (no CUDA
// headers); RaceTally, the bookkeeping, is tested on any machine.
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/runtime.h"
#include "core/device.h"
#include "core/error.h"

namespace zt::cuda {

// Timed calls of each candidate before a race is decided (every op's).
inline constexpr int kRaceSamples = 3;

// Which candidate each call of one shape runs: round-robin, the fewest
// samples first, until every available candidate has `samples_each` timed
// calls; then the one whose fastest call was fastest (the minimum, not the
// mean: a candidate's first call pays for loading its module, and any call
// may share the GPU with communication). Ties go to the lower index, so a
// caller lists its candidates in order of preference.
class RaceTally {
 public:
  RaceTally(int candidates, int samples_each);

  int candidates() const { return int(slots_.size()); }
  // While undecided: the available candidate with the fewest calls (timed or
  // in flight), the lowest index on a tie. Decided: the winner. -1: none is
  // available.
  int next() const;
  bool decided() const { return winner_ >= 0; }
  int winner() const { return winner_; }

  void launched(int c);          // a timed call of c is in flight
  void timed(int c, double ms);  // one of them came back: `ms` of GPU time
  void refused(int c);           // c cannot run this shape: never chosen again
  bool available(int c) const { return !slot(c).refused; }
  int timed_calls(int c) const { return slot(c).timed; }
  double best_ms(int c) const { return slot(c).best_ms; }  // +inf before its first timing

 private:
  struct Slot {
    int timed = 0, in_flight = 0;
    double best_ms = std::numeric_limits<double>::infinity();
    bool refused = false;
  };
  const Slot& slot(int c) const;
  Slot& slot(int c);
  void decide_if_done();

  std::vector<Slot> slots_;
  int samples_each_;
  int winner_ = -1;
};

// A tally as a line: each candidate's fastest call and calls timed, and the
// choice (names[c]: candidate c).
std::string format_race(const RaceTally& tally, const std::vector<std::string>& names);

// False when ZT_CUDA_KERNEL_RACES=0 in the environment: every race's call
// then takes its first candidate (the A/B of the races, and a way around one
// that misbehaves).
bool kernel_races_on();

// A RaceTally on one GPU's compute stream: run(launch) calls launch(c) for
// the candidate c the tally names, between two timing marks while the race
// is on; launch returns false when c refuses the call (nothing launched),
// and the next candidate is tried. The marks of earlier calls are read (and
// returned to the pool) once they have completed. Thread-safe.
class KernelRace {
 public:
  KernelRace(Device device, int candidates, int samples_each);
  KernelRace(const KernelRace&) = delete;
  KernelRace& operator=(const KernelRace&) = delete;
  ~KernelRace();

  // Returns the candidate that ran. With races off (kernel_races_on) the
  // first candidate that accepts the call, untimed.
  template <typename Launch>
  int run(Launch&& launch) {
    if (!kernel_races_on()) {
      for (int c = 0; c < tally_.candidates(); ++c)
        if (launch(c)) return c;
      ZT_FAIL("internal: every kernel of a race refused the call");
    }
    std::lock_guard<std::mutex> lock(mu_);
    read_completed();
    for (;;) {
      const int c = next_or_fail();
      if (tally_.decided()) {
        if (launch(c)) return c;
        tally_.refused(c);  // (a winner cannot refuse later: its key fixes the shape)
        continue;
      }
      // The start mark goes back to the pool unless the call's pair of
      // marks is listed (a launch that throws, or the end mark's record).
      struct StartMark {
        TimingMark mark;
        bool kept = false;
        ~StartMark() {
          if (!kept) release_mark(mark);
        }
      } start{record_mark(device_)};
      if (!launch(c)) {
        tally_.refused(c);
        continue;
      }
      const TimingMark end = record_mark(device_);
      in_flight_.push_back({c, start.mark, end});
      start.kept = true;
      tally_.launched(c);
      return c;
    }
  }

  // The tally after reading every completed call's time.
  RaceTally tally();

 private:
  struct InFlight {
    int candidate;
    TimingMark start, end;
  };
  void read_completed();  // requires mu_
  int next_or_fail() const;

  Device device_;
  std::mutex mu_;
  RaceTally tally_;
  std::vector<InFlight> in_flight_;
};

// The lines of every race this process has run, over all ops ("<op> <call>:
// <standings>"): what the trainer prints at the end of a GPU run.
std::vector<std::string> kernel_race_lines();
// An op's lines for kernel_race_lines (each RaceBook adds its own).
void add_race_report(std::function<std::vector<std::string>()> lines);

// One op's races, one per shape of call (Key: what makes one kernel faster
// than another - the GPU, dtype, sizes, in place or not). Never destroyed
// (make it with new): kernel_race_lines reads it at any time.
template <typename Key>
class RaceBook {
 public:
  struct Standing {
    Key key;
    RaceTally tally;
  };

  // `names[c]`: candidate c as the lines name it; `describe(key)` names a
  // call. Each candidate is timed kRaceSamples times.
  RaceBook(std::string op, std::vector<std::string> names, std::function<std::string(const Key&)> describe)
      : op_(std::move(op)), names_(std::move(names)), describe_(std::move(describe)) {
    add_race_report([this] {
      std::vector<std::string> lines;
      for (const Standing& s : standings()) lines.push_back(op_ + " " + describe_(s.key) + ": " + format(s.tally));
      return lines;
    });
  }

  // A call of `key`'s shape on `device` (KernelRace::run).
  template <typename Launch>
  int run(const Key& key, Device device, Launch&& launch) {
    return race(key, device).run(std::forward<Launch>(launch));
  }

  std::vector<Standing> standings() {
    std::vector<std::pair<Key, KernelRace*>> listed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [k, r] : races_) listed.emplace_back(k, r.get());
    }
    std::vector<Standing> out;
    for (auto& [k, r] : listed) out.push_back({k, r->tally()});
    return out;
  }

  // "rows4 0.312 ms (3 calls), staged cannot run it, ... -> rows4" (or "-> racing").
  std::string format(const RaceTally& t) const { return format_race(t, names_); }

 private:
  KernelRace& race(const Key& key, Device device) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, r] : races_)
      if (k == key) return *r;
    races_.emplace_back(key, std::make_unique<KernelRace>(device, int(names_.size()), kRaceSamples));
    return *races_.back().second;
  }

  std::string op_;
  std::vector<std::string> names_;
  std::function<std::string(const Key&)> describe_;
  std::mutex mu_;
  std::vector<std::pair<Key, std::unique_ptr<KernelRace>>> races_;  // few: one per shape of call
};

}  // namespace zt::cuda
