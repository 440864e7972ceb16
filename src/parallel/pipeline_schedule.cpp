#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"

namespace zt::parallel {

std::string_view pipeline_schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::afab: return "afab";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
    case PipelineSchedule::zero_bubble: return "zb";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(std::string_view s) {
  if (s == "afab") return PipelineSchedule::afab;
  if (s == "1f1b") return PipelineSchedule::one_f_one_b;
  if (s == "interleaved") return PipelineSchedule::interleaved;
  if (s == "zb") return PipelineSchedule::zero_bubble;
  ZT_FAIL("unknown pipeline schedule '", s, "'; valid: afab, 1f1b, interleaved, zb");
}

std::string_view action_name(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::backward_input: return "backward_input";
    case ActionKind::backward_weight: return "backward_weight";
  }
  return "?";
}

bool receives_before(const Action& a, int64_t stage, int64_t stages) {
  if (a.kind == ActionKind::forward) return stage > 0;
  return a.kind != ActionKind::backward_weight && stage < stages - 1;
}

bool sends_after(const Action& a, int64_t stage, int64_t stages) {
  if (a.kind == ActionKind::forward) return stage < stages - 1;
  return a.kind != ActionKind::backward_weight && stage > 0;
}

void check_pipeline_schedule(PipelineSchedule kind, const PipelineShape& s) {
  const std::string name(pipeline_schedule_name(kind));
  ZT_CHECK(s.stages >= 1 && s.micro_batches >= 1 && s.virtual_stages >= 1, "pipeline: pp = ", s.stages,
           ", micro-batches = ", s.micro_batches, " and virtual_stages = ", s.virtual_stages, " must all be >= 1");
  if (kind == PipelineSchedule::interleaved) {
    ZT_CHECK(s.virtual_stages >= 2, "pp_schedule = interleaved needs parallel.virtual_stages >= 2 (model chunks per "
             "rank), got ", s.virtual_stages, "; use 1f1b for one chunk per rank");
    ZT_CHECK(s.micro_batches % s.stages == 0, "pp_schedule = interleaved runs micro-batches in groups of pp = ",
             s.stages, ", but a step has ", s.micro_batches, " micro-batches; make global_batch / (micro_batch x dp) "
             "a multiple of ", s.stages);
  } else {
    ZT_CHECK(s.virtual_stages == 1, "parallel.virtual_stages = ", s.virtual_stages, " needs pp_schedule = "
             "interleaved (", name, " runs one model chunk per rank); set virtual_stages = 1");
  }
}

namespace {

using Schedule = std::vector<std::vector<Action>>;

Schedule afab(const PipelineShape& s) {
  Schedule out(static_cast<size_t>(s.stages));
  for (auto& rank : out) {
    for (int64_t i = 0; i < s.micro_batches; ++i) rank.push_back({ActionKind::forward, i, 0});
    for (int64_t i = 0; i < s.micro_batches; ++i) rank.push_back({ActionKind::backward, i, 0});
  }
  return out;
}

// Megatron's interleaved order (v = 1: plain 1F1B). Forward k (0 .. m v - 1)
// runs chunk (k / p) mod v of micro-batch (k / (p v)) p + k mod p; backward
// k the same with the chunks reversed.
Schedule one_f_one_b(const PipelineShape& s) {
  const int64_t p = s.stages, m = s.micro_batches, v = s.virtual_stages, total = m * v;
  auto fwd = [&](int64_t k) {
    return Action{ActionKind::forward, (k / (p * v)) * p + k % p, (k / p) % v};
  };
  auto bwd = [&](int64_t k) {
    return Action{ActionKind::backward, (k / (p * v)) * p + k % p, v - 1 - (k / p) % v};
  };
  Schedule out(static_cast<size_t>(p));
  for (int64_t r = 0; r < p; ++r) {
    // Warm-up forwards: enough that the first backward's input arrives when
    // this rank would otherwise idle.
    int64_t warm = v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p;
    if (v > 1 && m == p) warm = total;  // Megatron: one round of micro-batches is all forwards first
    warm = std::min(warm, total);
    auto& a = out[size_t(r)];
    for (int64_t k = 0; k < warm; ++k) a.push_back(fwd(k));
    for (int64_t k = 0; k < total - warm; ++k) {
      a.push_back(fwd(warm + k));
      a.push_back(bwd(k));
    }
    for (int64_t k = total - warm; k < total; ++k) a.push_back(bwd(k));
  }
  return out;
}

// The runtime dependencies of an action, for the simulator and for ZB's
// list scheduling: (rank, action) pairs that must have finished.
struct Key {
  ActionKind kind;
  int64_t mb, stage;
  bool operator<(const Key& o) const { return std::tie(kind, mb, stage) < std::tie(o.kind, o.mb, o.stage); }
};

int64_t stage_of(const Action& a, int64_t rank, int64_t p) { return a.chunk * p + rank; }

// What must be finished (anywhere) before `a` can start on `rank`.
std::vector<Key> inputs_of(const Action& a, int64_t rank, const PipelineShape& s) {
  const int64_t p = s.stages, S = p * s.virtual_stages, st = stage_of(a, rank, p);
  std::vector<Key> deps;
  switch (a.kind) {
    case ActionKind::forward:
      if (st > 0) deps.push_back({ActionKind::forward, a.micro_batch, st - 1});
      break;
    case ActionKind::backward:
    case ActionKind::backward_input: {
      deps.push_back({ActionKind::forward, a.micro_batch, st});
      const ActionKind grad = a.kind;  // the next stage's backward of the same flavour
      if (st + 1 < S) deps.push_back({grad, a.micro_batch, st + 1});
      break;
    }
    case ActionKind::backward_weight: deps.push_back({ActionKind::backward_input, a.micro_batch, st}); break;
  }
  return deps;
}

double cost_of(ActionKind k, const PassCosts& c) {
  switch (k) {
    case ActionKind::forward: return c.forward;
    case ActionKind::backward: return c.backward_input + c.backward_weight;
    case ActionKind::backward_input: return c.backward_input;
    case ActionKind::backward_weight: return c.backward_weight;
  }
  return 0;
}

// ZB-H1: 1F1B's order with each backward split in two; rank r runs the
// weight-gradient pass of micro-batch k after the input-gradient pass of
// k + r (the last r at the end). Later stages thus return input gradients
// upstream sooner and spend the cool-down, where they would idle, on the
// weight passes they held back. At most p micro-batches in flight on any
// rank (forwarded, weight pass not run): 1F1B's first-stage bound.
Schedule zero_bubble(const PipelineShape& s) {
  const int64_t p = s.stages, m = s.micro_batches;
  Schedule out(static_cast<size_t>(p));
  for (int64_t r = 0; r < p; ++r) {
    auto& a = out[size_t(r)];
    const int64_t warm = std::min(p - r - 1, m);
    int64_t inputs = 0, weights = 0;
    auto input_grad = [&](int64_t k) {
      a.push_back({ActionKind::backward_input, k, 0});
      ++inputs;
      for (; weights < inputs - r; ++weights) a.push_back({ActionKind::backward_weight, weights, 0});
    };
    for (int64_t k = 0; k < warm; ++k) a.push_back({ActionKind::forward, k, 0});
    for (int64_t k = 0; k < m - warm; ++k) {
      a.push_back({ActionKind::forward, warm + k, 0});
      input_grad(k);
    }
    for (int64_t k = m - warm; k < m; ++k) input_grad(k);
    for (; weights < m; ++weights) a.push_back({ActionKind::backward_weight, weights, 0});
  }
  return out;
}

}  // namespace

std::vector<std::vector<Action>> build_pipeline_schedule(PipelineSchedule kind, const PipelineShape& shape) {
  check_pipeline_schedule(kind, shape);
  switch (kind) {
    case PipelineSchedule::afab: return afab(shape);
    case PipelineSchedule::one_f_one_b:
    case PipelineSchedule::interleaved: return one_f_one_b(shape);
    case PipelineSchedule::zero_bubble: return zero_bubble(shape);
  }
  return {};
}

PipelineSimulation simulate_pipeline(const std::vector<std::vector<Action>>& schedule, const PipelineShape& s,
                                     const PassCosts& costs) {
  const int64_t p = s.stages;
  ZT_ASSERT(int64_t(schedule.size()) == p, "a schedule has one action list per rank");
  std::map<Key, double> finished;
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> free_at(size_t(p), 0.0), work(size_t(p), 0.0);
  std::vector<int64_t> in_flight(size_t(p), 0);
  PipelineSimulation out;
  out.peak_in_flight.assign(size_t(p), 0);
  size_t left = 0;
  for (const auto& a : schedule) left += a.size();
  while (left > 0) {
    bool progressed = false;
    for (int64_t r = 0; r < p; ++r) {
      const size_t i = size_t(r);
      while (next[i] < schedule[i].size()) {
        const Action& a = schedule[i][next[i]];
        double t = free_at[i];
        bool ready = true;
        for (const Key& k : inputs_of(a, r, s)) {
          auto it = finished.find(k);
          if (it == finished.end()) {
            ready = false;
            break;
          }
          t = std::max(t, it->second);
        }
        if (!ready) break;
        const Key key{a.kind, a.micro_batch, stage_of(a, r, p)};
        ZT_ASSERT(!finished.count(key), "rank ", r, " runs ", action_name(a.kind), " of micro-batch ", a.micro_batch,
                  " chunk ", a.chunk, " twice");
        const double c = cost_of(a.kind, costs);
        finished[key] = t + c;
        free_at[i] = t + c;
        work[i] += c;
        // Activations live from the forward until the last backward pass of that chunk.
        if (a.kind == ActionKind::forward) out.peak_in_flight[i] = std::max(out.peak_in_flight[i], ++in_flight[i]);
        if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) --in_flight[i];
        ++next[i];
        --left;
        progressed = true;
      }
    }
    ZT_ASSERT(progressed, "the pipeline schedule deadlocks: no rank can run its next action");
  }
  // Every (micro-batch, stage) forwarded and backwarded exactly once.
  const int64_t S = p * s.virtual_stages;
  for (int64_t mb = 0; mb < s.micro_batches; ++mb)
    for (int64_t st = 0; st < S; ++st) {
      ZT_ASSERT(finished.count({ActionKind::forward, mb, st}), "micro-batch ", mb, " never runs forward on stage ", st);
      ZT_ASSERT(finished.count({ActionKind::backward, mb, st}) ||
                    (finished.count({ActionKind::backward_input, mb, st}) &&
                     finished.count({ActionKind::backward_weight, mb, st})),
                "micro-batch ", mb, " never runs backward on stage ", st);
    }
  out.makespan = *std::max_element(free_at.begin(), free_at.end());
  out.work_per_rank = *std::max_element(work.begin(), work.end());
  for (int64_t r = 0; r < p; ++r) out.idle.push_back(out.makespan - work[size_t(r)]);
  out.bubble = (out.makespan - out.work_per_rank) / out.work_per_rank;
  return out;
}

double theoretical_bubble(PipelineSchedule kind, const PipelineShape& s, const PassCosts& c) {
  const double p = double(s.stages), m = double(s.micro_batches), v = double(s.virtual_stages);
  switch (kind) {
    case PipelineSchedule::afab:
    case PipelineSchedule::one_f_one_b: return (p - 1) / m;
    case PipelineSchedule::interleaved: return (p - 1) / (v * m);
    case PipelineSchedule::zero_bubble:
      return (p - 1) * (c.forward + c.backward_input - c.backward_weight) /
             (m * (c.forward + c.backward_input + c.backward_weight));
  }
  return 0;
}

}  // namespace zt::parallel
