// Files that survive crashes: write to PATH.tmp, fsync, rename into place,
// fsync the directory. A reader then sees either the old file or the whole
// new one, never a torn write (POSIX rename is atomic within a filesystem).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/hash.h"

namespace zt::ckpt {

// strerror-style text for an errno value.
std::string errno_text(int err);

// A file being written; every byte passes through a Checksum64 so callers
// learn the checksum of exactly what reached the disk without reading it back.
class DurableWriter {
 public:
  // Creates PATH.tmp (truncating a stale one). Throws zt::Error naming PATH.
  explicit DurableWriter(std::string path);
  ~DurableWriter();  // not committed: closes and removes PATH.tmp
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;

  void write(const void* data, size_t n);
  // fsync, close, rename PATH.tmp -> PATH, fsync the directory.
  void commit();

  uint64_t bytes() const { return bytes_; }
  uint64_t checksum() const { return sum_.digest(); }  // Checksum64 of the bytes written so far

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  Checksum64 sum_;
};

// Writes `content` to `path` durably (as above).
void write_file_durably(const std::string& path, const std::string& content);

// fsync of a directory, so renames and creations inside it are durable.
// Filesystems that cannot fsync directories (EINVAL) are accepted.
void fsync_directory(const std::string& dir);

// Checksum64 and size of a file's bytes, read in 8 MiB blocks.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};
FileDigest digest_file(const std::string& path);

}  // namespace zt::ckpt
