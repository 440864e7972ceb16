#include "data/shard.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace zt::data {
namespace {

template <typename T>
void put(std::vector<unsigned char>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}
template <typename T>
T get(const unsigned char* b, size_t off) {
  T v;
  std::memcpy(&v, b + off, sizeof(T));
  return v;
}

constexpr size_t kWriteBuffer = size_t(1) << 20;

}  // namespace

std::vector<unsigned char> encode_shard_header(const ShardHeader& h) {
  std::vector<unsigned char> b(kShardHeaderBytes, 0);
  std::memcpy(b.data(), kShardMagic, 8);
  put<uint32_t>(b, 8, h.version);
  put<uint32_t>(b, 12, h.token_bytes);
  put<uint64_t>(b, 16, h.token_count);
  put<uint64_t>(b, 24, h.checksum);
  put<uint32_t>(b, 32, h.vocab_size);
  put<uint64_t>(b, 40, h.documents);
  put<uint64_t>(b, 56, checksum64(b.data(), 56));
  return b;
}

ShardWriter::ShardWriter(std::string path, uint32_t token_bytes, uint32_t vocab_size) : path_(std::move(path)) {
  ZT_ASSERT(token_bytes == 2 || token_bytes == 4);
  header_.token_bytes = token_bytes;
  header_.vocab_size = vocab_size;
  f_ = std::fopen(path_.c_str(), "wb");
  ZT_CHECK(f_, "cannot create shard '", path_, "': ", std::strerror(errno));
  // Placeholder header (all zero: no magic) until finish().
  const std::vector<unsigned char> zero(kShardHeaderBytes, 0);
  ZT_CHECK(std::fwrite(zero.data(), 1, zero.size(), f_) == zero.size(), "cannot write shard '", path_,
           "': ", std::strerror(errno));
  buf_.reserve(kWriteBuffer);
}

ShardWriter::~ShardWriter() {
  if (f_) std::fclose(f_);
}

void ShardWriter::append(const uint32_t* ids, size_t n) {
  ZT_ASSERT(f_, "append after finish");
  const size_t tb = header_.token_bytes;
  while (n > 0) {
    const size_t room = (kWriteBuffer - buf_.size()) / tb;
    const size_t k = std::min(n, room);
    const size_t old = buf_.size();
    buf_.resize(old + k * tb);
    unsigned char* out = buf_.data() + old;
    if (tb == 2) {
      for (size_t i = 0; i < k; ++i) {
        const uint16_t v = uint16_t(ids[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
    } else {
      std::memcpy(out, ids, k * 4);
    }
    header_.token_count += k;
    ids += k;
    n -= k;
    if (buf_.size() + tb > kWriteBuffer) flush_buffer();
  }
}

void ShardWriter::flush_buffer() {
  if (buf_.empty()) return;
  sum_.update(buf_.data(), buf_.size());
  ZT_CHECK(std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size(), "cannot write shard '", path_,
           "': ", std::strerror(errno));
  buf_.clear();
}

ShardHeader ShardWriter::finish() {
  ZT_ASSERT(f_, "finish called twice");
  flush_buffer();
  header_.checksum = sum_.digest();
  const auto h = encode_shard_header(header_);
  bool ok = std::fflush(f_) == 0 && std::fseek(f_, 0, SEEK_SET) == 0 &&
            std::fwrite(h.data(), 1, h.size(), f_) == h.size() && std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  const int err = errno;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  ZT_CHECK(ok, "cannot finish shard '", path_, "': ", std::strerror(err));
  return header_;
}

ShardReader::ShardReader(const std::string& path, uint32_t vocab_size, bool verify) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ZT_CHECK(fd >= 0, "shard '", path, "' cannot be opened: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    ZT_FAIL("shard '", path, "' cannot be read: ", std::strerror(err));
  }
  const uint64_t file_bytes = uint64_t(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    ZT_FAIL("shard '", path, "' is truncated: ", file_bytes, " bytes, shorter than the ", kShardHeaderBytes,
            "-byte header");
  }
  void* addr = ::mmap(nullptr, size_t(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  ZT_CHECK(addr != MAP_FAILED, "shard '", path, "' cannot be memory-mapped: ", std::strerror(err));
  map_.addr = addr;
  map_.bytes = size_t(file_bytes);
  const auto* b = static_cast<const unsigned char*>(addr);
  ZT_CHECK(std::memcmp(b, kShardMagic, 8) == 0, "shard '", path,
           "' is not a Zettatron token shard (bad magic; an unfinished or foreign file)");
  header_.version = get<uint32_t>(b, 8);
  ZT_CHECK(header_.version == kShardVersion, "shard '", path, "' has format version ", header_.version,
           "; this build reads version ", kShardVersion, " (re-run `zettatron prepare`)");
  ZT_CHECK(get<uint64_t>(b, 56) == checksum64(b, 56), "shard '", path,
           "' has a corrupted header (header checksum mismatch)");
  header_.token_bytes = get<uint32_t>(b, 12);
  header_.token_count = get<uint64_t>(b, 16);
  header_.checksum = get<uint64_t>(b, 24);
  header_.vocab_size = get<uint32_t>(b, 32);
  header_.documents = get<uint64_t>(b, 40);
  ZT_CHECK(header_.token_bytes == 2 || header_.token_bytes == 4, "shard '", path, "' has an invalid token width (",
           header_.token_bytes, " bytes; expected 2 or 4)");
  const uint64_t want = kShardHeaderBytes + header_.token_count * header_.token_bytes;
  ZT_CHECK(file_bytes >= want, "shard '", path, "' is truncated: its header says ", header_.token_count,
           " tokens (", want, " bytes) but the file has ", file_bytes, " bytes");
  ZT_CHECK(file_bytes == want, "shard '", path, "' has ", file_bytes - want,
           " bytes after its last token (header says ", header_.token_count, " tokens)");
  ZT_CHECK(header_.vocab_size == vocab_size, "shard '", path, "' was written for a vocabulary of ",
           header_.vocab_size, " tokens but the index says ", vocab_size);
  tokens_ = b + kShardHeaderBytes;
  if (!verify) return;
  const uint64_t sum = checksum64(tokens_, header_.token_count * header_.token_bytes);
  ZT_CHECK(sum == header_.checksum, "shard '", path, "' is corrupted: checksum mismatch (header ",
           hex64(header_.checksum), ", data ", hex64(sum), ")");
  // Largest id, then (rarely) where the first bad one is.
  uint32_t max_id = 0;
  if (header_.token_bytes == 2) {
    const auto* t = reinterpret_cast<const uint16_t*>(tokens_);
    uint16_t m = 0;
#pragma omp simd reduction(max : m)
    for (uint64_t i = 0; i < header_.token_count; ++i) m = std::max(m, t[i]);
    max_id = m;
  } else {
    const auto* t = reinterpret_cast<const uint32_t*>(tokens_);
    uint32_t m = 0;
#pragma omp simd reduction(max : m)
    for (uint64_t i = 0; i < header_.token_count; ++i) m = std::max(m, t[i]);
    max_id = m;
  }
  if (max_id >= vocab_size) {
    uint64_t i = 0;
    uint32_t v = 0;
    for (; i < header_.token_count; ++i) {
      v = header_.token_bytes == 2 ? get<uint16_t>(tokens_, 2 * i) : get<uint32_t>(tokens_, 4 * i);
      if (v >= vocab_size) break;
    }
    ZT_FAIL("shard '", path, "' holds token id ", v, " at token ", i, ", but the vocabulary has only ",
            vocab_size, " tokens (ids must be < ", vocab_size, ")");
  }
}

ShardReader::~ShardReader() = default;
ShardReader::Mapping::~Mapping() {
  if (addr) ::munmap(addr, bytes);
}

void ShardReader::read(uint64_t first, uint64_t count, int32_t* out) const {
  ZT_ASSERT(first + count <= header_.token_count, "shard read out of range");
  if (header_.token_bytes == 2) {
    const auto* t = reinterpret_cast<const uint16_t*>(tokens_) + first;
    for (uint64_t i = 0; i < count; ++i) out[i] = int32_t(t[i]);
  } else {
    std::memcpy(out, reinterpret_cast<const uint32_t*>(tokens_) + first, count * 4);
  }
}

}  // namespace zt::data
