// The tuned matmul choices file (contract: backend/cuda/matmul_plans.h).
#include "backend/cuda/matmul_plans.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace zt::cuda {

std::string format_matmul_choice(const MatmulChoice& choice) {
  return choice.cublas ? "cublas" : "lt " + std::to_string(choice.candidate);
}

std::optional<MatmulChoice> parse_matmul_choice(std::string_view text) {
  if (text == "cublas") return MatmulChoice{.cublas = true};
  if (!text.starts_with("lt ")) return std::nullopt;
  const std::string_view digits = text.substr(3);
  int n = -1;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (err != std::errc() || end != digits.data() + digits.size() || n < 0 || n >= kMatmulCandidates)
    return std::nullopt;
  return MatmulChoice{.candidate = n};
}

MatmulPlanFile::MatmulPlanFile(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    const std::optional<MatmulChoice> choice =
        tab == std::string::npos ? std::nullopt : parse_matmul_choice(std::string_view(line).substr(0, tab));
    ZT_CHECK(choice && tab + 1 < line.size(), "matmul plans ", path_, ":", number,
             ": expected \"lt <n>\" or \"cublas\", a tab, then the product, got '", line,
             "'; delete the line (or the file) and a tuning run records it again");
    choices_.emplace(line.substr(tab + 1), *choice);  // the first line for a product wins
  }
}

std::optional<MatmulChoice> MatmulPlanFile::find(const std::string& product) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = choices_.find(product);
  if (it == choices_.end()) return std::nullopt;
  return it->second;
}

void MatmulPlanFile::record(const std::string& product, const MatmulChoice& choice) {
  std::lock_guard<std::mutex> lock(mu_);
  if (choices_.contains(product)) return;
  std::string line = format_matmul_choice(choice) + "\t" + product + "\n";
  const int fd = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  ZT_CHECK(fd >= 0, "matmul plans ", path_, ": cannot open for appending (", std::strerror(errno),
           "); point ZT_CUDA_MATMUL_PLANS at a writable file");
  // A file edited by hand may end without a newline: the line must not join
  // its last one (the next read would reject the product).
  if (const off_t size = ::lseek(fd, 0, SEEK_END); size > 0) {
    char last = '\n';
    if (::pread(fd, &last, 1, size - 1) == 1 && last != '\n') line.insert(line.begin(), '\n');
  }
  const ssize_t written = ::write(fd, line.data(), line.size());
  const int write_errno = errno;
  ::close(fd);
  ZT_CHECK(written == ssize_t(line.size()), "matmul plans ", path_, ": cannot append a line (",
           written < 0 ? std::strerror(write_errno) : "short write", "); point ZT_CUDA_MATMUL_PLANS at a writable file");
  choices_.emplace(product, choice);
}

}  // namespace zt::cuda
