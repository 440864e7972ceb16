// zt_bench_tokenizer: GPT-2 tokenisation speed of Zettatron against tiktoken
// (the npm package: WASM build of OpenAI's Rust tokenizer) in the same run,
// and `prepare` end to end against the tokenizer alone.
//
//   zt_bench_tokenizer [--corpus DIR] [--copies 16] [--reps 5]
//
// Corpora: the fortunes files concatenated (as they are on disk), and that
// text repeated N times. Rates are MB of input text per second, best of R
// runs (Zettatron's measurements interleaved, so that load changes on a
// shared machine hit them alike). Every Zettatron run starts with a freshly loaded tokenizer (an empty
// piece cache; loading is not timed), so repeated text in the large corpus
// helps only as much as it would within one run. Zettatron's ids are checked
// equal to tiktoken's (count and a checksum) before anything is reported.
// Prints a Markdown report on stdout.
#include <cstdint>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using zt::data::Tokenizer;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint32_t id_checksum(const std::vector<uint32_t>& ids) {
  uint32_t s = 0;
  for (size_t i = 0; i < ids.size(); ++i) s += uint32_t(i + 1) * ids[i];
  return s;
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Rate {
  double mb_per_s = 0;
  double cpu_s = 0;  // process CPU time of the best run (all threads)
  size_t tokens = 0;
  uint32_t checksum = 0;
};

// One run of encode on `threads` threads with a freshly loaded tokenizer;
// keeps the best (fastest) run in `r`.
void zt_encode(const std::string& text, int threads, Rate& r) {
  auto tok = zt::data::load_tokenizer("gpt2");
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  const auto ids = threads == 1 ? tok->encode(text) : tok->encode_parallel(text, threads);
  const double wall = seconds_since(t0), cpu = cpu_seconds() - c0;
  const double rate = double(text.size()) / 1e6 / wall;
  if (rate > r.mb_per_s) {
    r.mb_per_s = rate;
    r.cpu_s = cpu;
  }
  r.tokens = ids.size();
  r.checksum = id_checksum(ids);
}

Rate tiktoken_encode(const std::string& file, int reps) {
  const std::string script = std::string(ZT_SOURCE_DIR) + "/bench/tokenizer/tiktoken_bench.mjs";
  const std::string cmd = "node " + shell_quote(script) + " " + shell_quote(file) + " " +
                          shell_quote(zt::data::cache_dir()) + " " + std::to_string(reps);
  FILE* p = ::popen(cmd.c_str(), "r");
  ZT_CHECK(p, "cannot run node");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int rc = ::pclose(p);
  ZT_CHECK(rc == 0, "the tiktoken peer failed (is node installed? run `make deps`): ", cmd);
  const auto j = nlohmann::json::parse(out);
  Rate r;
  r.mb_per_s = j.at("mb_per_s").get<double>();
  r.tokens = j.at("tokens").get<size_t>();
  r.checksum = j.at("checksum").get<uint32_t>();
  return r;
}

// One prepare run (fresh tokenizer, loading not timed); keeps the best rate.
void zt_prepare(const fs::path& input, const fs::path& out, int threads, double& best_mb_per_s) {
  auto tok = zt::data::load_tokenizer("gpt2");
  zt::data::PrepareOptions o;
  o.inputs = {input.string()};
  o.output = out.string();
  o.doc_split = zt::data::DocSplit::percent;
  o.val_fraction = 0.01;
  o.threads = threads;
  o.force = true;
  o.progress = false;
  const auto t0 = Clock::now();
  const auto s = zt::data::prepare(o, *tok, nullptr);
  best_mb_per_s = std::max(best_mb_per_s, double(s.bytes) / 1e6 / seconds_since(t0));
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string fmt(double v, int prec = 1) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << v;
  return s.str();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string corpus = "/usr/share/games/fortunes";
  int copies = 16, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--corpus") corpus = argv[i + 1];
    else if (a == "--copies") copies = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else ZT_FAIL("unknown option ", a, " (--corpus DIR, --copies N, --reps R)");
  }
  double load_start = -1;
  ::getloadavg(&load_start, 1);
  ZT_CHECK(fs::is_directory(corpus), "corpus folder ", corpus, " not found (the Debian package fortunes: make deps)");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(corpus))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += read_file(f);

  const fs::path tmp = fs::temp_directory_path() / ("zt_bench_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(tmp / "small");
  fs::create_directories(tmp / "large");
  for (const auto& f : files) {
    fs::copy_file(f, tmp / "small" / f.filename());
    for (int c = 0; c < copies; ++c) fs::copy_file(f, tmp / "large" / (f.filename().string() + "." + std::to_string(c)));
  }
  std::string large;
  for (const auto& f : files)
    for (int c = 0; c < copies; ++c) large += read_file(f);  // the same order prepare reads tmp/large in
  {
    std::ofstream(tmp / "small.txt", std::ios::binary) << text;
    std::ofstream(tmp / "large.txt", std::ios::binary) << large;
  }

  struct Row {
    std::string name;
    double mb;
    Rate tik, one, two;
    double prep1, prep2;
  };
  std::vector<Row> rows;
  for (const auto& [name, body, dir] : {std::tuple{std::string("fortunes"), &text, tmp / "small"},
                                         std::tuple{"fortunes x" + std::to_string(copies), &large, tmp / "large"}}) {
    Row r;
    r.name = name;
    r.mb = double(body->size()) / 1e6;
    std::cerr << "bench: " << name << " (" << fmt(r.mb) << " MB): tiktoken..." << std::flush;
    r.tik = tiktoken_encode((name == "fortunes" ? tmp / "small.txt" : tmp / "large.txt").string(), reps);
    std::cerr << " zettatron and prepare..." << std::flush;
    // Interleaved, so that a change in the machine's load hits every measurement alike.
    r.prep1 = r.prep2 = 0;
    for (int i = 0; i < reps; ++i) {
      zt_encode(*body, 1, r.one);
      zt_prepare(dir, tmp / "out", 1, r.prep1);
      zt_encode(*body, 2, r.two);
      zt_prepare(dir, tmp / "out", 2, r.prep2);
    }
    std::cerr << " done\n";
    ZT_CHECK(r.one.tokens == r.tik.tokens && r.one.checksum == r.tik.checksum && r.two.checksum == r.one.checksum,
             "token ids differ from tiktoken's on ", name, ": ", r.one.tokens, " vs ", r.tik.tokens, " tokens");
    rows.push_back(r);
  }
  fs::remove_all(tmp);

  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) < 0) load[0] = -1;
  std::cout << "| corpus | MB | tokens | tiktoken 1 thread MB/s | Zettatron 1 thread MB/s | vs tiktoken | "
               "Zettatron 2 threads MB/s | 2-thread speedup | CPU time 2 threads / 1 thread | "
               "prepare 1 thread MB/s | prepare / tokenizer | prepare 2 threads MB/s |\n";
  std::cout << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    std::cout << "| " << r.name << " | " << fmt(r.mb) << " | " << r.one.tokens << " | " << fmt(r.tik.mb_per_s) << " | "
              << fmt(r.one.mb_per_s) << " | " << fmt(r.one.mb_per_s / r.tik.mb_per_s, 2) << "x | "
              << fmt(r.two.mb_per_s) << " | " << fmt(r.two.mb_per_s / r.one.mb_per_s, 2) << "x | "
              << fmt(r.two.cpu_s / r.one.cpu_s, 2) << " | " << fmt(r.prep1)
              << " | " << fmt(r.prep1 / r.one.mb_per_s, 2) << " | " << fmt(r.prep2) << " |\n";
  }
  std::cout << "\nBest of " << reps << " runs each; every Zettatron run uses a freshly loaded tokenizer (cold piece "
            << "cache). Token ids identical to tiktoken's (count and checksum). \"CPU time 2 threads / 1 thread\" "
            << "is the process CPU time of the two runs: near 1 means the second thread adds no work, so the "
            << "speedup is limited only by how much of the second core is free. Machine: " << cpu_model() << ", "
            << ::sysconf(_SC_NPROCESSORS_ONLN) << " cores; load average at the start " << fmt(load_start, 2)
            << ", at the end " << fmt(load[0], 2) << " (other work on the machine makes rates noisy).\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
