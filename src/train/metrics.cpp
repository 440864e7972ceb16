#include "train/metrics.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zt::train {

MetricsLog::MetricsLog(const std::string& path, bool append)
    : out_(path, std::ios::out | (append ? std::ios::app : std::ios::trunc)) {
  ZT_CHECK(out_.good(), "cannot write metrics file '", path, "'");
}

void CommTraffic::add(const comm::CommStats& now, const comm::CommStats& start) {
  bytes += now.bytes_sent - start.bytes_sent;
  busy_seconds += now.busy_seconds - start.busy_seconds;
  exposed_seconds += now.wait_seconds - start.wait_seconds;
}

double CommTraffic::overlap() const {
  if (busy_seconds <= 0) return 1.0;
  return std::clamp(1.0 - exposed_seconds / busy_seconds, 0.0, 1.0);
}

namespace {
// metrics.jsonl's record of one dimension's traffic, keyed by its name.
nlohmann::json traffic_json(const char* dim, const CommTraffic& c) {
  return {{dim, c.size}, {"bytes", c.bytes}, {"busy_s", c.busy_seconds}, {"exposed_s", c.exposed_seconds},
          {"overlap", c.overlap()}};
}

// The progress line's part for one dimension: the exposed share of the step,
// the hidden share of the time in flight, the volume.
std::string traffic_line(const char* dim, const CommTraffic& c, double step_s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, " | %s comm %.0f%% of step, %.0f%% hidden, %.1f MB", dim,
                100.0 * c.exposed_seconds / step_s, 100.0 * c.overlap(), double(c.bytes) / 1e6);
  return buf;
}
}  // namespace

void MetricsLog::write_step(const StepMetrics& m) {
  nlohmann::json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  if (m.expert_load_max > 0) {
    j["router_aux_loss"] = m.router_aux_loss;
    j["expert_load_max"] = m.expert_load_max;
    j["expert_dropped_max"] = m.expert_dropped_max;
  }
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["skipped"] = m.skipped;
  if (m.loss_scale > 0) {
    j["loss_scale"] = m.loss_scale;
    j["overflow"] = m.overflow;
  }
  j["tokens"] = m.tokens;
  j["tokens_seen"] = m.tokens_seen;
  j["tokens_per_s"] = m.tokens_per_second;
  j["mfu"] = m.mfu;
  j["world"] = m.world;
  j["time_s"] = {{"step", m.step_seconds},
                 {"forward", m.forward_seconds},
                 {"head", m.head_seconds},
                 {"backward", m.backward_seconds},
                 {"optimizer", m.optimizer_seconds},
                 {"data", m.data_seconds}};
  if (m.dp_comm.size > 1) {
    nlohmann::json worst;
    for (int c = 0; c < kNumMemCategories; ++c)
      worst[std::string(mem_category_name(MemCategory(c)))] = m.max_peak_memory.peak_bytes[size_t(c)];
    worst["total"] = m.max_peak_memory.total_peak_bytes;
    j["memory_peak_max_rank"] = {{"rank", m.max_peak_rank}, {"peak_bytes", worst}};
    j["comm"] = traffic_json("dp", m.dp_comm);
  }
  if (m.pp_size > 1)
    j["pipeline"] = {{"pp", m.pp_size},
                     {"bubble_per_stage", m.pp_bubble_per_stage},
                     {"bubble_theory", m.pp_bubble_theory},
                     {"p2p_wait_per_stage", m.pp_wait_per_stage},
                     {"in_flight_per_stage", m.pp_in_flight_per_stage}};
  if (m.offloaded_activation_bytes > 0 || m.offload_host_bytes > 0)
    j["offload"] = {{"activation_bytes", m.offloaded_activation_bytes}, {"host_bytes", m.offload_host_bytes}};
  if (m.tp_comm.size > 1) j["comm_tp"] = traffic_json("tp", m.tp_comm);
  if (m.cp_comm.size > 1) j["comm_cp"] = traffic_json("cp", m.cp_comm);
  if (m.ep_comm.size > 1) j["comm_ep"] = traffic_json("ep", m.ep_comm);
  if (!m.op_totals.empty()) {
    nlohmann::json ops;
    for (const ops::OpTotal& t : m.op_totals)
      ops[t.name] = {{"calls", t.calls},
                     {"s", t.seconds},
                     {"workspace_bytes", t.workspace_peak_bytes},
                     {"cache_misses", t.cache_misses},
                     {"flops", t.flops}};
    j["ops"] = ops;
  }
  nlohmann::json mem, peak;
  for (int c = 0; c < kNumMemCategories; ++c) {
    const std::string name(mem_category_name(MemCategory(c)));
    mem[name] = m.memory.current_bytes[size_t(c)];
    peak[name] = m.memory.peak_bytes[size_t(c)];
  }
  mem["total"] = m.memory.total_current_bytes;
  peak["total"] = m.memory.total_peak_bytes;
  j["memory_bytes"] = mem;
  j["peak_memory_bytes"] = peak;
  out_ << j.dump() << "\n";
  out_.flush();
}

void MetricsLog::write_eval(int64_t step, double val_loss, int64_t val_tokens,
                            const std::vector<std::pair<std::string, double>>& by_dataset) {
  nlohmann::json j{{"step", step}, {"val_loss", val_loss}, {"val_tokens", val_tokens}};
  if (!by_dataset.empty()) {
    nlohmann::json each = nlohmann::json::object();
    for (const auto& [name, loss] : by_dataset) each[name] = loss;
    j["val_loss_by_dataset"] = each;
  }
  out_ << j.dump() << "\n";
  out_.flush();
}

namespace {
std::string format_duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}
}  // namespace

std::string format_step_line(const StepMetrics& m) {
  const double step_s = m.step_seconds > 0 ? m.step_seconds : 1e-9;
  const double eta = m.elapsed_seconds / double(std::max<int64_t>(1, m.step)) * double(m.total_steps - m.step);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "step %5lld/%lld | loss %.4f%s | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%% | "
                "fwd %.0f%% head %.0f%% bwd %.0f%% opt %.0f%% data %.0f%% | mem %.0f MiB | ETA %s",
                (long long)m.step, (long long)m.total_steps, m.loss,
                m.overflow ? " (skipped: gradient overflow)" : m.skipped ? " (skipped)" : "", m.lr,
                m.grad_norm, m.tokens_per_second, 100.0 * m.mfu, 100.0 * m.forward_seconds / step_s,
                100.0 * m.head_seconds / step_s, 100.0 * m.backward_seconds / step_s,
                100.0 * m.optimizer_seconds / step_s, 100.0 * m.data_seconds / step_s,
                double(m.memory.total_peak_bytes) / (1 << 20),
                format_duration(eta).c_str());
  std::string line = buf;
  if (m.expert_load_max > 0) {
    std::snprintf(buf, sizeof buf, " | moe aux %.4f, busiest expert %.2fx", m.router_aux_loss, m.expert_load_max);
    line += buf;
    if (m.expert_dropped_max > 0) {
      std::snprintf(buf, sizeof buf, ", dropped %.1f%%", 100.0 * m.expert_dropped_max);
      line += buf;
    }
  }
  if (m.loss_scale > 0) {
    std::snprintf(buf, sizeof buf, " | loss scale %g", m.loss_scale);
    line += buf;
  }
  if (m.dp_comm.size > 1) {
    // Communication share: the exposed part of the step, and how much of the
    // time communication was in flight was hidden behind compute.
    line += traffic_line("dp", m.dp_comm, step_s);
    std::snprintf(buf, sizeof buf, " | peak rank %lld %.0f MiB", (long long)m.max_peak_rank,
                  double(m.max_peak_memory.total_peak_bytes) / (1 << 20));
    line += buf;
  }
  if (m.pp_size > 1 && !m.pp_bubble_per_stage.empty()) {
    double most = 0;
    for (double b : m.pp_bubble_per_stage) most = std::max(most, b);
    std::snprintf(buf, sizeof buf, " | pp bubble %.0f%% of the schedule at the idlest stage (theory %.0f%%)", 100.0 * most,
                  100.0 * m.pp_bubble_theory);
    line += buf;
  }
  if (m.tp_comm.size > 1) line += traffic_line("tp", m.tp_comm, step_s);
  if (m.cp_comm.size > 1) line += traffic_line("cp", m.cp_comm, step_s);
  if (m.ep_comm.size > 1) line += traffic_line("ep", m.ep_comm, step_s);
  return line;
}

void add_op_totals(std::vector<ops::OpTotal>& run, const std::vector<ops::OpTotal>& step) {
  for (const ops::OpTotal& t : step) {
    auto it = std::find_if(run.begin(), run.end(), [&](const ops::OpTotal& r) { return r.name == t.name; });
    if (it == run.end()) {
      run.push_back(t);
    } else {
      it->calls += t.calls;
      it->seconds += t.seconds;
      it->workspace_peak_bytes = std::max(it->workspace_peak_bytes, t.workspace_peak_bytes);
      it->cache_misses += t.cache_misses;
      it->flops += t.flops;
    }
  }
}

std::string format_op_profile(std::vector<ops::OpTotal> run, int64_t steps, double step_seconds) {
  std::sort(run.begin(), run.end(), [](const ops::OpTotal& a, const ops::OpTotal& b) { return a.seconds > b.seconds; });
  const double n = double(std::max<int64_t>(steps, 1));
  const double step_ms = step_seconds * 1e3 / n;
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line, "  %-28s %10s %12s %7s %9s %14s %14s\n", "op", "calls/step", "ms/step", "share",
                "TFLOP/s", "workspace MiB", "misses/step");
  out += line;
  double covered = 0;
  for (const ops::OpTotal& t : run) {
    const double ms = t.seconds * 1e3 / n;
    covered += ms;
    char rate[32] = "-";  // ops that report no arithmetic (memory-bound ones)
    if (t.flops > 0 && t.seconds > 0) std::snprintf(rate, sizeof rate, "%.2f", t.flops / t.seconds / 1e12);
    std::snprintf(line, sizeof line, "  %-28s %10.1f %12.3f %6.1f%% %9s %14.1f %14.1f\n", t.name.c_str(),
                  double(t.calls) / n, ms, step_ms > 0 ? 100.0 * ms / step_ms : 0.0, rate,
                  double(t.workspace_peak_bytes) / 1048576.0, double(t.cache_misses) / n);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-28s %10s %12.3f %6.1f%%  (step %.3f ms)", "outside ops", "",
                step_ms - covered, step_ms > 0 ? 100.0 * (step_ms - covered) / step_ms : 0.0, step_ms);
  out += line;
  return out;
}

}  // namespace zt::train
