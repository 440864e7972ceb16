#include "ckpt/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

namespace zt::ckpt {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

DurableWriter::DurableWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    ZT_FAIL(path_, ": cannot create ", tmp_, ": ", errno_text(errno));
  }
}

DurableWriter::~DurableWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void DurableWriter::write(const void* data, size_t n) {
  ZT_ASSERT(fd_ >= 0, "write after commit");
  sum_.update(data, n);
  bytes_ += n;
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    ZT_CHECK(w > 0, tmp_, ": write failed: ", w < 0 ? errno_text(errno) : std::string("no progress"),
             " (disk full?)");
    p += w;
    n -= size_t(w);
  }
}

void DurableWriter::commit() {
  ZT_ASSERT(fd_ >= 0, "commit twice");
  ZT_CHECK(::fsync(fd_) == 0, tmp_, ": fsync failed: ", errno_text(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    ZT_FAIL(tmp_, ": close failed: ", errno_text(err));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    ZT_FAIL(path_, ": cannot rename ", tmp_, " into place: ", errno_text(err));
  }
  std::string dir = std::filesystem::path(path_).parent_path().string();
  fsync_directory(dir.empty() ? "." : dir);
}

void write_file_durably(const std::string& path, const std::string& content) {
  DurableWriter w(path);
  w.write(content.data(), content.size());
  w.commit();
}

void fsync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZT_CHECK(dfd >= 0, "cannot open the directory ", dir, " to fsync it: ", errno_text(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  ZT_CHECK(rc == 0 || err == EINVAL, "fsync of the directory ", dir, " failed: ", errno_text(err));
}

FileDigest digest_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZT_CHECK(fd >= 0, path, ": cannot open: ", errno_text(errno));
  std::vector<char> buf(size_t(8) << 20);
  Checksum64 c;
  FileDigest d;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      ZT_FAIL(path, ": read failed: ", errno_text(err));
    }
    if (r == 0) break;
    c.update(buf.data(), size_t(r));
    d.bytes += uint64_t(r);
  }
  ::close(fd);
  d.checksum = c.digest();
  return d;
}

}  // namespace zt::ckpt
