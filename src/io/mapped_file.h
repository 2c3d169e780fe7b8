// A read-only image of a whole regular file: memory-mapped, or held in memory where mapping is impossible.
//
// A mapped file that another process truncates while it is mapped would kill the process with SIGBUS on
// the next read of a page past the new end. Every mapping is therefore registered with a SIGBUS handler
// (installed on first use; other SIGBUS causes go to the previous handler or the default action) that
// replaces the whole mapping with zero pages, marks it, and lets the faulting read continue. The damage is
// reported by check_intact() / check_mapped_files(), which also catch files modified in place (size or
// modification time changed), so results computed from a changed file are never written.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace alpamayo {

class MappedFile {
 public:
  // Opens a regular file (io/inputs.h: never blocks on a pipe) and maps it.
  explicit MappedFile(const std::string& path);
  // An in-memory image (no file); never changes.
  MappedFile(std::string bytes, std::string name);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Throws Error naming the file if it was truncated (a read hit a missing page) or modified since it was
  // opened.
  void check_intact() const;

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  int slot_ = -1;
  std::string bytes_;  // the image when not mapped
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int64_t mtime_ns_ = 0;
  friend void check_mapped_files();
};

// check_intact() of every mapped file alive in the process.
void check_mapped_files();

}  // namespace alpamayo
