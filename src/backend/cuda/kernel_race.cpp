// The kernel race (kernel_race.h): its tally and its timing marks.
#include "backend/cuda/kernel_race.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/env.h"
#include "core/error.h"

namespace zt::cuda {

RaceTally::RaceTally(int candidates, int samples_each)
    : slots_(size_t(std::max(candidates, 0))), samples_each_(samples_each) {
  ZT_CHECK(candidates >= 1 && samples_each >= 1, "internal: a kernel race of ", candidates, " candidates, ",
           samples_each, " samples each");
}

const RaceTally::Slot& RaceTally::slot(int c) const {
  ZT_CHECK(c >= 0 && c < candidates(), "internal: kernel race candidate ", c, " of ", candidates());
  return slots_[size_t(c)];
}

RaceTally::Slot& RaceTally::slot(int c) { return const_cast<Slot&>(std::as_const(*this).slot(c)); }

int RaceTally::next() const {
  if (decided()) return winner_;
  int best = -1;
  for (int c = 0; c < candidates(); ++c) {
    const Slot& s = slots_[size_t(c)];
    if (s.refused) continue;
    const Slot* b = best < 0 ? nullptr : &slots_[size_t(best)];
    if (b == nullptr || s.timed + s.in_flight < b->timed + b->in_flight) best = c;
  }
  return best;
}

void RaceTally::launched(int c) { ++slot(c).in_flight; }

void RaceTally::timed(int c, double ms) {
  Slot& s = slot(c);
  ZT_CHECK(s.in_flight > 0, "internal: a timing of kernel race candidate ", c, " that was not launched");
  --s.in_flight;
  ++s.timed;
  s.best_ms = std::min(s.best_ms, ms);
  decide_if_done();
}

void RaceTally::refused(int c) {
  slot(c).refused = true;
  if (winner_ == c) winner_ = -1;
  decide_if_done();
}

void RaceTally::decide_if_done() {
  if (decided()) return;
  int best = -1;
  for (int c = 0; c < candidates(); ++c) {
    const Slot& s = slots_[size_t(c)];
    if (s.refused) continue;
    if (s.timed < samples_each_) return;  // still racing
    if (best < 0 || s.best_ms < slots_[size_t(best)].best_ms) best = c;
  }
  winner_ = best;  // -1 only when every candidate refused
}

bool kernel_races_on() {
  static const bool on =
      env_switch("ZT_CUDA_KERNEL_RACES", "1 (default): same-bit kernels race on their first calls; 0: the first", true);
  return on;
}

KernelRace::KernelRace(Device device, int candidates, int samples_each)
    : device_(device), tally_(candidates, samples_each) {}

KernelRace::~KernelRace() {
  for (const InFlight& f : in_flight_) {
    release_mark(f.start);
    release_mark(f.end);
  }
}

void KernelRace::read_completed() {
  // A call leaves the list before its marks go back to the pool, so a
  // failed query (a CUDA error) leaves every listed call as it was.
  for (size_t i = 0; i < in_flight_.size();) {
    const InFlight f = in_flight_[i];
    if (!event_completed(f.end, "a timed kernel of a kernel race")) {
      ++i;
      continue;
    }
    const double ms = double(elapsed_ms(f.start, f.end));
    in_flight_.erase(in_flight_.begin() + std::ptrdiff_t(i));
    release_mark(f.start);
    release_mark(f.end);
    tally_.timed(f.candidate, ms);
  }
}

int KernelRace::next_or_fail() const {
  const int c = tally_.next();
  ZT_CHECK(c >= 0, "internal: every kernel of a race refused the call");
  return c;
}

RaceTally KernelRace::tally() {
  std::lock_guard<std::mutex> lock(mu_);
  read_completed();
  return tally_;
}

std::string format_race(const RaceTally& t, const std::vector<std::string>& names) {
  ZT_CHECK(int(names.size()) == t.candidates(), "internal: ", names.size(), " names for a race of ", t.candidates());
  std::string line;
  for (int c = 0; c < t.candidates(); ++c) {
    line += (c == 0 ? "" : ", ") + names[size_t(c)];
    if (!t.available(c)) {
      line += " cannot run it";
    } else if (t.timed_calls(c) == 0) {
      line += " untimed";
    } else {
      char ms[48];
      std::snprintf(ms, sizeof ms, " %.3f ms (%d call%s)", t.best_ms(c), t.timed_calls(c),
                    t.timed_calls(c) == 1 ? "" : "s");
      line += ms;
    }
  }
  return line + " -> " + (t.decided() ? names[size_t(t.winner())] : std::string("racing"));
}

namespace {

struct Reports {
  std::mutex mu;
  std::vector<std::function<std::vector<std::string>()>> all;
};

Reports& reports() {
  static auto* r = new Reports();  // never freed, as the books it lists
  return *r;
}

}  // namespace

void add_race_report(std::function<std::vector<std::string>()> lines) {
  Reports& r = reports();
  std::lock_guard<std::mutex> lock(r.mu);
  r.all.push_back(std::move(lines));
}

std::vector<std::string> kernel_race_lines() {
  std::vector<std::function<std::vector<std::string>()>> all;
  {
    Reports& r = reports();
    std::lock_guard<std::mutex> lock(r.mu);
    all = r.all;
  }
  std::vector<std::string> out;
  for (const auto& lines : all)
    for (std::string& l : lines()) out.push_back(std::move(l));
  return out;
}

}  // namespace zt::cuda
