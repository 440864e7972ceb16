// The world group, backend selection, counters and job-wide helpers.
#include "comm/process_group.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/mpi_group.h"
#include "comm/solo_group.h"
#include "core/error.h"
#include "core/trace.h"

namespace zt::comm {

namespace {

std::atomic<int64_t> g_step{0};

struct World {
  std::mutex mu;
  std::unique_ptr<ProcessGroup> group;
  WorldInfo info;
};

World& the_world() {
  static World* w = new World;  // lives until exit; its group is released by the atexit handler
  return *w;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (std::getenv(v)) return true;
  return false;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

void finalize_at_exit() {
  World& w = the_world();
  std::lock_guard<std::mutex> lock(w.mu);
  const bool mpi = w.info.backend == "mpi";
  w.group.reset();  // stops the world's comm thread
  if (!mpi) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Both of a send_recv's transfers: done when both are.
class PairWork : public Work {
 public:
  PairWork(WorkHandle a, WorkHandle b) : a_(std::move(a)), b_(std::move(b)) {}
  bool test() override { return a_->test() && b_->test(); }
  void wait() override {
    a_->wait();
    b_->wait();
  }

 private:
  WorkHandle a_, b_;
};

}  // namespace

WorkHandle ProcessGroup::send_recv(const Tensor& sent, int dst, const Tensor& received, int src, int tag) {
  return std::make_shared<PairWork>(send(sent, dst, tag), recv(received, src, tag));
}

std::vector<double> all_gather_doubles(ProcessGroup& g, std::span<const double> mine) {
  if (g.size() == 1) return {mine.begin(), mine.end()};
  // Bit for bit, as i64 (the reductions do not take f64).
  const int64_t n = int64_t(mine.size());
  Tensor buf = Tensor::empty(Shape{n}, DType::i64, Device::cpu(), MemCategory::comm);
  Tensor all = Tensor::empty(Shape{g.size() * n}, DType::i64, Device::cpu(), MemCategory::comm);
  std::memcpy(buf.data_ptr(), mine.data(), size_t(n) * 8);
  g.all_gather(all, buf)->wait();
  std::vector<double> out(size_t(g.size() * n));
  std::memcpy(out.data(), all.data_ptr(), out.size() * 8);
  return out;
}

std::vector<double> all_gather_doubles(ProcessGroup& g, double v) { return all_gather_doubles(g, std::span(&v, 1)); }

std::vector<std::string> all_gather_strings(ProcessGroup& g, const std::string& mine) {
  if (g.size() == 1) return {mine};
  // Lengths first, then every rank's bytes padded to the longest.
  int64_t most = 0;
  std::vector<int64_t> lens;
  for (double len : all_gather_doubles(g, double(mine.size()))) {
    lens.push_back(int64_t(len));
    most = std::max(most, int64_t(len));
  }
  const int64_t words = std::max<int64_t>(1, (most + 7) / 8);
  Tensor buf = Tensor::empty(Shape{words}, DType::i64, Device::cpu(), MemCategory::comm);
  Tensor all = Tensor::empty(Shape{g.size() * words}, DType::i64, Device::cpu(), MemCategory::comm);
  std::memset(buf.data_ptr(), 0, buf.nbytes());
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  g.all_gather(all, buf)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < g.size(); ++r)
    out.emplace_back(static_cast<const char*>(all.data_ptr()) + size_t(r) * buf.nbytes(), size_t(lens[size_t(r)]));
  return out;
}

double sum_exact(ProcessGroup& g, double v) {
  double total = 0;
  for (double x : all_gather_doubles(g, v)) total += x;  // in rank order: the same bits everywhere
  return total;
}

double max_over(ProcessGroup& g, double v) {
  if (g.size() == 1) return v;
  const std::vector<double> all = all_gather_doubles(g, v);
  return *std::max_element(all.begin(), all.end());
}

CommStats ProcessGroup::stats() const {
  update_stats();
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void ProcessGroup::count_op(int64_t bytes_sent) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.ops;
  stats_.bytes_sent += bytes_sent;
}

void ProcessGroup::add_busy(const std::string& op, std::chrono::steady_clock::time_point start,
                            std::chrono::steady_clock::time_point end) {
  if (trace_on()) trace_span("comm " + name_, op, start, end);
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.busy_seconds += std::chrono::duration<double>(end - start).count();
}

void ProcessGroup::add_busy_seconds(double seconds) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.busy_seconds += seconds;
}

void ProcessGroup::add_wait(double seconds) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.wait_seconds += seconds;
}

ProcessGroup& world(const CommOptions& options) {
  World& w = the_world();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.group) return *w.group;
  std::string backend = options.backend;
  if (const char* env = std::getenv("ZT_COMM_BACKEND")) backend = env;
  ZT_CHECK(backend == "auto" || backend == "solo" || backend == "mpi", "comm backend '", backend,
           "': choose auto, solo or mpi");
  if (backend == "auto") backend = launched_by_mpi() ? "mpi" : "solo";
  double timeout = options.timeout_seconds;
  if (const char* env = std::getenv("ZT_COMM_TIMEOUT")) timeout = std::atof(env);
  ZT_CHECK(timeout > 0, "the comm timeout must be positive, got ", timeout, " s");
  w.info.backend = backend;
  w.info.timeout_seconds = timeout;
  if (backend == "solo") {
    w.group = std::make_unique<SoloGroup>("world");
  } else {
    init_mpi();
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    w.group = std::make_unique<MpiGroup>(comm, "world", timeout);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.group->rank(), MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &w.info.local_rank);
    MPI_Comm_size(local, &w.info.local_size);
    MPI_Comm_free(&local);
  }
  w.info.rank = w.group->rank();
  w.info.size = w.group->size();
  if (backend == "solo") {
    w.info.local_rank = env_int("SLURM_LOCALID", 0);
    w.info.local_size = 1;
  }
  std::atexit(finalize_at_exit);
  return *w.group;
}

WorldInfo world_info() {
  world();
  World& w = the_world();
  std::lock_guard<std::mutex> lock(w.mu);
  return w.info;
}

std::unique_ptr<ProcessGroup> make_solo_group(const std::string& name) {
  return std::make_unique<SoloGroup>(name);
}

void set_current_step(int64_t step) { g_step = step; }
int64_t current_step() { return g_step; }

bool in_multi_process_job() {
  World& w = the_world();
  std::lock_guard<std::mutex> lock(w.mu);
  return w.group && w.info.backend == "mpi" && w.info.size > 1;
}

void abort_job_after_error(int exit_code) {
  if (!in_multi_process_job()) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace zt::comm
