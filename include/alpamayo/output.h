// Output files, written safely in shared directories and committed all together or not at all.
//
//   OutputSet outs;
//   outs.add_input(context_path, "--context");      // outputs may never be an input
//   const size_t o = outs.add(out_path, "--out");   // checked and reserved now, before any work
//   ... compute ...
//   serialize_safetensors(outs.sink(o), tensors);   // or outs.write(o, bytes, n)
//   outs.commit();                                  // all outputs appear, or none
//
// What add() guarantees, before any work is done:
// - the path names a file (not empty, not a directory) in an existing directory;
// - an existing file there is a regular file and not a symbolic link (a device such as /dev/null, a pipe
//   or a link is refused, never replaced);
// - it is not one of the inputs, nor another output of the set (compared by device and inode, so other
//   spellings of the same path and hard links are caught);
// - the directory is writable: the temporary file is created at once, exclusively (O_CREAT | O_EXCL |
//   O_NOFOLLOW), with an unpredictable name (".NAME.<random>.tmp") in the target's directory, so nobody
//   can plant a link or a file under it.
// commit() syncs every temporary file and renames each over its target, exchanging it with the old file
// (renameat2 RENAME_EXCHANGE) so that a failure part-way restores every earlier target. Until commit()
// returns, nothing of the set is visible; if the set is destroyed or discard()ed first, or the process gets
// SIGINT, SIGTERM or SIGHUP, every temporary file is removed. Inputs that are memory-mapped by the library are
// checked (check_mapped_files) before anything is committed.
//
// Limits: a SIGKILL or a power loss leaves the temporary files (hidden, named after the target); on file
// systems without RENAME_EXCHANGE an earlier target cannot be restored if a later rename fails.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace alpamayo {

// Receives a file's bytes in order.
using ByteSink = std::function<void(const void* data, size_t n)>;

class OutputSet {
 public:
  OutputSet();
  ~OutputSet();  // removes every temporary file not committed
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;

  // A file or directory the run reads. An output may not be it (or, for a directory, any file in it,
  // links followed). Paths that do not exist are ignored (the reader reports them). label names it in
  // messages (e.g. "--context").
  void add_input(const std::string& path, const std::string& label = "input");
  void add_input_dir(const std::string& dir, const std::string& label = "input");

  // Declares an output, checks it and creates its temporary file (see above). Returns its index.
  // Throws Error naming label and path.
  size_t add(const std::string& path, const std::string& label = "output");

  // Creates the directory dir (and its missing parents) for outputs of the set: every directory created here
  // is removed again (it is empty then) when the set is not committed: on errors, discard(), the destructor
  // and SIGINT / SIGTERM / SIGHUP. An existing directory is used as it is. Throws Error naming label and dir.
  void create_dir(const std::string& dir, const std::string& label = "output");
  // Throws Error("<stage> needs about <bytes> of disk (<parts>) but only <free> is free in <dir>") when the
  // file system of output i has less room for an unprivileged user than bytes.
  void check_space(size_t i, double bytes, const std::string& stage, const std::string& parts) const;
  // Appends bytes to output i; throws Error naming the path (e.g. disk full).
  void write(size_t i, const void* data, size_t n);
  void write(size_t i, const std::string& s) { write(i, s.data(), s.size()); }
  ByteSink sink(size_t i);

  // Makes every output appear at its path, or none (see above).
  void commit();
  // Removes every temporary file; the set is empty afterwards.
  void discard();

  size_t size() const;
  const std::string& path(size_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One output written by produce() and committed: the convenience for single files.
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce);

}  // namespace alpamayo
