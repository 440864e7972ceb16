#include "data/prepare.h"

#include <cstdint>
#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/dataset_index.h"
#include "data/shard.h"
#include "data/unicode.h"

namespace zt::data {
namespace fs = std::filesystem;

DocSplit parse_doc_split(std::string_view s) {
  for (DocSplit d : {DocSplit::automatic, DocSplit::file, DocSplit::percent, DocSplit::blank, DocSplit::line,
                     DocSplit::jsonl})
    if (s == doc_split_name(d)) return d;
  ZT_FAIL("unknown document split '", s, "': expected auto, file, percent, blank, line or jsonl");
}

const char* doc_split_name(DocSplit s) {
  switch (s) {
    case DocSplit::automatic: return "auto";
    case DocSplit::file: return "file";
    case DocSplit::percent: return "percent";
    case DocSplit::blank: return "blank";
    case DocSplit::line: return "line";
    case DocSplit::jsonl: return "jsonl";
  }
  return "?";
}

void PrepareOptions::validate() const {
  ZT_CHECK(!inputs.empty(), "prepare: no --input given (files or folders of text)");
  ZT_CHECK(!output.empty(), "prepare: no --output folder given");
  ZT_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "prepare: --val-fraction must be in [0, 1), got ",
           val_fraction);
  ZT_CHECK(shard_tokens >= 1, "prepare: --shard-tokens must be at least 1");
  ZT_CHECK(threads >= 0, "prepare: --threads must be >= 0 (0 = all cores), got ", threads);
}

namespace {

bool blank(std::string_view s) {
  for (char c : s)
    if (!(c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f')) return false;
  return true;
}

std::string_view chomp(std::string_view line) {  // without "\r" at the end
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// A read-only view of a whole file (mmap; files are read once, front to back).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ZT_CHECK(fd >= 0, "input file '", path, "' cannot be opened: ", std::strerror(errno));
    struct stat st;
    const bool ok = ::fstat(fd, &st) == 0;
    size_ = ok ? size_t(st.st_size) : 0;
    if (ok && size_ > 0) {
      addr_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (addr_ == MAP_FAILED) addr_ = nullptr;
      if (addr_) ::madvise(addr_, size_, MADV_SEQUENTIAL);
    }
    const int err = errno;
    ::close(fd);
    ZT_CHECK(ok && (size_ == 0 || addr_), "input file '", path, "' cannot be read: ", std::strerror(err));
  }
  ~MappedFile() {
    if (addr_) ::munmap(addr_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view text() const { return {static_cast<const char*>(addr_), addr_ ? size_ : 0}; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

struct InputFile {
  std::string path;
  uint64_t bytes = 0;
  int folder = -1;  // index of the input folder it was found in; -1: named directly
};

struct InputScan {
  std::vector<InputFile> files;
  std::vector<std::string> folders;  // the folder inputs, by index
  nlohmann::json skipped_counts = {{"hidden", 0}, {"symlink", 0}, {"empty", 0}, {"binary", 0}};
  void skip(const char* why) { skipped_counts[why] = skipped_counts[why].get<uint64_t>() + 1; }
  uint64_t skipped() const {
    uint64_t n = 0;
    for (const auto& [k, v] : skipped_counts.items()) n += v.get<uint64_t>();
    return n;
  }
};

// Offset of the first NUL byte in the first 64 KiB, or -1 (a NUL means binary).
int64_t first_nul(std::string_view text) {
  const void* p = std::memchr(text.data(), 0, std::min<size_t>(text.size(), 65536));
  return p ? static_cast<const char*>(p) - text.data() : -1;
}

// Lists the input files. Binary files inside folders are recognised later,
// when they are read (reading them twice would cost more than the scan).
InputScan scan_inputs(const std::vector<std::string>& inputs) {
  InputScan scan;
  std::set<std::pair<uint64_t, uint64_t>> seen;  // (device, inode): a file named twice is read once
  auto add = [&](const fs::path& p, uint64_t bytes, int folder) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0 && !seen.insert({uint64_t(st.st_dev), uint64_t(st.st_ino)}).second) return;
    scan.files.push_back({p.string(), bytes, folder});
  };
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    ZT_CHECK(fs::exists(st), "input '", in, "' does not exist");
    if (fs::is_regular_file(st)) {
      const uint64_t bytes = fs::file_size(in);
      ZT_CHECK(bytes > 0, "input file '", in, "' is empty");
      add(in, bytes, -1);
      continue;
    }
    ZT_CHECK(fs::is_directory(st), "input '", in, "' is neither a file nor a folder");
    const int folder = int(scan.folders.size());
    scan.folders.push_back(in);
    std::vector<fs::path> found;
    for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied);
         it != fs::recursive_directory_iterator(); ++it) {
      const fs::path& p = it->path();
      const std::string name = p.filename().string();
      if (!name.empty() && name[0] == '.') {
        scan.skip("hidden");
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_symlink()) {  // not followed: avoids duplicates (fortunes' *.u8) and loops
        scan.skip("symlink");
        continue;
      }
      if (it->is_regular_file()) found.push_back(p);
    }
    std::sort(found.begin(), found.end());
    for (const fs::path& p : found) {
      const uint64_t bytes = fs::file_size(p);
      if (bytes == 0) {
        scan.skip("empty");
        continue;
      }
      add(p, bytes, folder);
    }
  }
  return scan;
}

// A whole input file in memory: read into a reusable buffer, or memory-mapped
// when large (so that memory stays bounded by the batch size).
class FileText {
 public:
  static constexpr uint64_t kMapAbove = uint64_t(64) << 20;
  void load(const InputFile& f) {
    map_.reset();
    if (f.bytes > kMapAbove) {
      map_ = std::make_unique<MappedFile>(f.path);
      text_ = map_->text();
      return;
    }
    std::FILE* fp = std::fopen(f.path.c_str(), "rb");
    ZT_CHECK(fp, "input file '", f.path, "' cannot be opened: ", std::strerror(errno));
    if (capacity_ < f.bytes) {  // grown, never zero-filled
      capacity_ = size_t(f.bytes);
      buf_ = std::make_unique_for_overwrite<char[]>(capacity_);
    }
    const size_t n = std::fread(buf_.get(), 1, size_t(f.bytes), fp);
    const bool err = std::ferror(fp);
    std::fclose(fp);
    ZT_CHECK(!err, "input file '", f.path, "' cannot be read");
    text_ = std::string_view(buf_.get(), n);  // n < bytes: the file shrank since the scan
  }
  std::string_view text() const { return text_; }

 private:
  std::unique_ptr<char[]> buf_;
  size_t capacity_ = 0;
  std::unique_ptr<MappedFile> map_;
  std::string_view text_;
};

// Progress on the log stream: a bar redrawn in place on a terminal, a line
// every 10% otherwise.
class Progress {
 public:
  Progress(std::ostream* log, bool enabled, uint64_t total_bytes)
      : log_(enabled ? log : nullptr), total_(std::max<uint64_t>(total_bytes, 1)), start_(Clock::now()) {
    tty_ = log_ == &std::cerr && ::isatty(STDERR_FILENO);
  }
  void update(uint64_t done, uint64_t tokens, bool final = false) {
    if (!log_) return;
    const auto now = Clock::now();
    const double frac = std::min(1.0, double(done) / double(total_));
    if (tty_ && !final && now - last_ < std::chrono::milliseconds(200)) return;
    if (!tty_ && int(frac * 10) <= last_decile_) return;
    last_ = now;
    last_decile_ = int(frac * 10);
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double mbps = secs > 0 ? double(done) / 1e6 / secs : 0.0;
    const double eta = (mbps > 0 && frac < 1) ? double(total_ - done) / 1e6 / mbps : 0.0;
    std::ostringstream s;
    const int width = 30, fill = int(frac * width);
    s << "prepare [" << std::string(size_t(fill), '=') << (fill < width ? ">" : "")
      << std::string(size_t(std::max(0, width - fill - 1)), ' ') << "] " << std::fixed << std::setprecision(1)
      << std::setw(5) << frac * 100 << "%  " << double(done) / 1e6 << "/" << double(total_) / 1e6 << " MB  "
      << mbps << " MB/s  ETA " << int(eta) / 60 << ":" << std::setw(2) << std::setfill('0') << int(eta) % 60
      << std::setfill(' ') << "  " << tokens << " tokens";
    if (tty_) {
      *log_ << "\r" << s.str() << (final ? "\n" : "") << std::flush;
    } else {
      *log_ << s.str() << "\n" << std::flush;
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream* log_;
  uint64_t total_;
  Clock::time_point start_, last_{};
  int last_decile_ = -1;
  bool tty_ = false;
};

// Shards of one split.
class SplitWriter {
 public:
  SplitWriter(std::string dir, Split split, uint32_t token_bytes, uint32_t vocab, uint64_t shard_tokens)
      : dir_(std::move(dir)), split_(split), token_bytes_(token_bytes), vocab_(vocab), shard_tokens_(shard_tokens) {}

  void append_document(const uint32_t* ids, size_t n) {
    size_t off = 0;
    while (off < n) {
      if (!cur_) open();
      const size_t take = size_t(std::min<uint64_t>(n - off, shard_tokens_ - cur_->tokens()));
      cur_->append(ids + off, take);
      off += take;
      if (off == n) {
        cur_->add_documents(1);
        ++info_.documents;
      }
      if (cur_->tokens() == shard_tokens_) close();
    }
    info_.tokens += n;
  }

  SplitInfo finish() {
    if (cur_) close();
    return info_;
  }

 private:
  void open() {
    char name[64];
    std::snprintf(name, sizeof(name), "%s-%06zu.bin", split_name(split_), info_.shards.size());
    cur_ = std::make_unique<ShardWriter>(dir_ + "/" + name, token_bytes_, vocab_);
    info_.shards.push_back({name, 0, 0, 0});
  }
  void close() {
    const ShardHeader h = cur_->finish();
    ShardInfo& s = info_.shards.back();
    s.tokens = h.token_count;
    s.documents = h.documents;
    s.checksum = h.checksum;
    cur_.reset();
  }

  std::string dir_;
  Split split_;
  uint32_t token_bytes_, vocab_;
  uint64_t shard_tokens_;
  std::unique_ptr<ShardWriter> cur_;
  SplitInfo info_;
};

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Removes the temporary folder unless released.
struct TempDirGuard {
  std::string path;
  ~TempDirGuard() {
    if (!path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

}  // namespace

std::vector<std::string_view> split_documents(std::string_view text, DocSplit mode, const std::string& file,
                                              std::deque<std::string>& storage) {
  std::vector<std::string_view> docs;
  auto keep = [&](std::string_view d) {
    if (!blank(d)) docs.push_back(d);
  };
  if (mode == DocSplit::automatic) mode = fs::path(file).extension() == ".jsonl" ? DocSplit::jsonl : DocSplit::file;
  if (mode == DocSplit::file) {
    keep(text);
    return docs;
  }
  size_t start = 0;         // start of the current document
  bool in_paragraph = false;  // blank mode: a non-blank line seen since start
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t e = text.find('\n', pos);
    const size_t next = e == std::string_view::npos ? text.size() : e + 1;
    if (e == std::string_view::npos) e = text.size();
    const std::string_view line = text.substr(pos, e - pos);
    ++line_no;
    switch (mode) {
      case DocSplit::percent:
        if (chomp(line) == "%") {
          keep(text.substr(start, pos - start));
          start = next;
        }
        break;
      case DocSplit::blank:
        if (blank(line)) {
          if (in_paragraph) keep(text.substr(start, pos - start));
          in_paragraph = false;
          start = next;
        } else {
          in_paragraph = true;
        }
        break;
      case DocSplit::line:
        keep(chomp(line));
        break;
      case DocSplit::jsonl: {
        if (blank(line)) break;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& ex) {
          ZT_FAIL("input file '", file, "' line ", line_no, " is not valid JSON: ", ex.what());
        }
        ZT_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), "input file '", file, "' line ",
                 line_no, ": expected a JSON object with a string \"text\" field");
        storage.push_back(j["text"].get<std::string>());
        keep(storage.back());
        break;
      }
      default:
        break;
    }
    pos = next;
  }
  if (mode == DocSplit::percent || (mode == DocSplit::blank && in_paragraph)) keep(text.substr(start));
  return docs;
}

PrepareSummary prepare(const PrepareOptions& opt, std::ostream* log) {
  opt.validate();
  const auto tok = load_tokenizer(opt.tokenizer);
  return prepare(opt, *tok, log);
}

PrepareSummary prepare(const PrepareOptions& opt, const Tokenizer& tok, std::ostream* log) {
  opt.validate();
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out = fs::path(opt.output).lexically_normal();
  ZT_CHECK(!out.filename().empty(), "prepare: --output '", opt.output, "' must name a folder");
  std::error_code ec;
  if (fs::exists(out, ec)) {
    ZT_CHECK(fs::is_directory(out), "prepare: --output '", opt.output, "' exists and is not a folder");
    ZT_CHECK(opt.force || fs::is_empty(out), "prepare: output folder '", opt.output,
             "' already exists; pass --force to replace it");
  }
  const InputScan scan = scan_inputs(opt.inputs);
  uint64_t total_bytes = 0;
  for (const auto& f : scan.files) total_bytes += f.bytes;

  if (!out.parent_path().empty()) fs::create_directories(out.parent_path());
  const std::string tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp);
  TempDirGuard guard{tmp};

  const uint32_t vocab = uint32_t(tok.vocab_size());
  const uint32_t token_bytes = token_bytes_for_vocab(vocab);
  const uint32_t eot = tok.eot_token();
  SplitWriter train(tmp, Split::train, token_bytes, vocab, opt.shard_tokens);
  SplitWriter val(tmp, Split::val, token_bytes, vocab, opt.shard_tokens);
  const int threads = opt.threads > 0 ? opt.threads : omp_get_num_procs();

  PrepareSummary sum;
  sum.output = out.string();
  nlohmann::json skipped = scan.skipped_counts;
  Progress progress(log, opt.progress, total_bytes);

  // Documents are gathered across files into batches of about 2 MB (the file
  // buffers are kept until their batch is written), tokenised in parallel
  // into per-thread buffers that are reused from batch to batch, then
  // appended to the shards in document order.
  constexpr uint64_t kBatchBytes = uint64_t(2) << 20;
  struct Held {
    FileText text;
    std::deque<std::string> storage;  // jsonl documents
  };
  std::vector<std::unique_ptr<Held>> held, spare;
  std::vector<std::string_view> batch;
  struct Span {
    int thread;
    size_t offset, count;
    bool invalid_utf8;
  };
  std::vector<Span> spans;
  std::vector<std::vector<uint32_t>> thread_tokens(static_cast<size_t>(threads));
  std::vector<uint64_t> folder_files(scan.folders.size(), 0);
  uint64_t batch_bytes = 0, doc_index = 0, done_bytes = 0, tokens = 0;
  const double f = opt.val_fraction;

  auto flush = [&] {
    const size_t n = batch.size();
    spans.resize(n);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      std::vector<uint32_t>& buf = thread_tokens[size_t(t)];
      buf.clear();
      buf.reserve(size_t(batch_bytes / 2 / uint64_t(threads)) + 1024);  // ~4 bytes per token: rarely regrows
#pragma omp for schedule(dynamic, 4)
      for (size_t k = 0; k < n; ++k) {
        const size_t off = buf.size();
        tok.encode_append(batch[k], buf);
        buf.push_back(eot);
        spans[k] = {t, off, buf.size() - off, !is_valid_utf8(batch[k].data(), batch[k].size())};
      }
    }
    for (size_t k = 0; k < n; ++k) {
      const Span& sp = spans[k];
      const bool to_val = std::floor(double(doc_index + 1) * f) > std::floor(double(doc_index) * f);
      (to_val ? val : train).append_document(thread_tokens[size_t(sp.thread)].data() + sp.offset, sp.count);
      tokens += sp.count;
      sum.invalid_utf8_documents += sp.invalid_utf8;
      ++doc_index;
    }
    sum.documents += n;
    batch.clear();
    for (auto& h : held) {
      h->storage.clear();
      spare.push_back(std::move(h));
    }
    held.clear();
    batch_bytes = 0;
    progress.update(done_bytes, tokens);
  };

  for (const InputFile& in : scan.files) {
    std::unique_ptr<Held> h;
    if (!spare.empty()) {
      h = std::move(spare.back());
      spare.pop_back();
    } else {
      h = std::make_unique<Held>();
    }
    h->text.load(in);
    const std::string_view text = h->text.text();
    const int64_t nul = first_nul(text);
    if (nul >= 0) {
      ZT_CHECK(in.folder >= 0, "input file '", in.path, "' looks binary (a NUL byte at offset ", nul,
               "): prepare reads text files");
      skipped["binary"] = skipped["binary"].get<uint64_t>() + 1;
      spare.push_back(std::move(h));
      done_bytes += in.bytes;
      continue;
    }
    ++sum.files;
    sum.bytes += in.bytes;
    if (in.folder >= 0) ++folder_files[size_t(in.folder)];
    const auto docs = split_documents(text, opt.doc_split, in.path, h->storage);
    held.push_back(std::move(h));  // the batch's views need the file until it is written
    for (std::string_view d : docs) {
      batch.push_back(d);
      batch_bytes += d.size();
      if (batch_bytes >= kBatchBytes) {
        // The current file must outlive this flush for its remaining documents.
        std::unique_ptr<Held> cur = std::move(held.back());
        held.pop_back();
        flush();
        held.push_back(std::move(cur));
      }
    }
    done_bytes += in.bytes;
  }
  if (!batch.empty()) flush();
  for (size_t i = 0; i < scan.folders.size(); ++i)
    ZT_CHECK(folder_files[i] > 0, "input folder '", scan.folders[i], "' has no text files (skipped: ", skipped.dump(),
             ")");
  ZT_CHECK(sum.documents > 0, "prepare: the inputs hold no documents (every one is empty or white space): ",
           nlohmann::json(opt.inputs).dump());
  sum.skipped_files = 0;
  for (const auto& [k, v] : skipped.items()) sum.skipped_files += v.get<uint64_t>();

  sum.train = train.finish();
  sum.val = val.finish();
  progress.update(total_bytes, tokens, true);

  DatasetIndex index;
  index.tokenizer_name = tok.name();
  index.tokenizer_fingerprint = tok.fingerprint();
  index.vocab_size = vocab;
  index.eot_token = eot;
  index.token_bytes = token_bytes;
  index.train = sum.train;
  index.val = sum.val;
  index.source = {{"inputs", opt.inputs},
                  {"files", sum.files},
                  {"bytes", sum.bytes},
                  {"documents", sum.documents},
                  {"doc_split", doc_split_name(opt.doc_split)},
                  {"val_fraction", opt.val_fraction},
                  {"shard_tokens", opt.shard_tokens},
                  {"skipped_files", skipped},
                  {"invalid_utf8_documents", sum.invalid_utf8_documents}};
  {
    const std::string path = tmp + "/index.json";
    std::ofstream o(path, std::ios::trunc);
    o << index.to_json().dump(2) << "\n";
    o.close();
    ZT_CHECK(o.good(), "prepare: cannot write '", path, "'");
    fsync_path(path);
    fsync_path(tmp);
  }
  // Into place: OUTPUT is absent or complete at every moment.
  if (fs::exists(out)) {
    const std::string old = out.string() + ".old-" + std::to_string(::getpid());
    fs::rename(out, old);
    fs::rename(tmp, out);
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, out);
  }
  guard.path.clear();
  fsync_path(out.parent_path().empty() ? "." : out.parent_path().string());
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (log) {
    *log << "prepared " << sum.documents << " documents (" << std::fixed << std::setprecision(1)
         << double(sum.bytes) / 1e6 << " MB, " << sum.files << " files";
    if (sum.skipped_files) *log << ", " << sum.skipped_files << " skipped";
    *log << ") with " << tok.name() << " in " << std::setprecision(2) << sum.seconds << " s ("
         << std::setprecision(1) << double(sum.bytes) / 1e6 / std::max(sum.seconds, 1e-9) << " MB/s): train "
         << sum.train.tokens << " tokens in " << sum.train.shards.size() << " shard(s), val " << sum.val.tokens
         << " tokens in " << sum.val.shards.size() << " shard(s) -> " << sum.output << "\n";
    if (sum.invalid_utf8_documents)
      *log << "note: " << sum.invalid_utf8_documents
           << " documents are not valid UTF-8; their invalid bytes were encoded byte by byte\n";
    if (opt.val_fraction > 0 && sum.val.tokens == 0)
      *log << "note: the validation split is empty (too few documents for --val-fraction " << opt.val_fraction
           << ")\n";
  }
  return sum;
}

}  // namespace zt::data
