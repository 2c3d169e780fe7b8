#include "alpamayo/output.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <random>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "io/inputs.h"
#include "io/mapped_file.h"

namespace alpamayo {
namespace {

// ---- temporary files registered for removal on SIGINT / SIGTERM / SIGHUP (read by the handler)
struct TmpSlot {
  std::atomic<int> active{0};
  int dirfd = -1;
  char name[NAME_MAX + 1] = {};
};
constexpr int kTmpSlots = 256;
TmpSlot g_tmp[kTmpSlots];
// Directories an uncommitted set created (removed after its files, deepest first).
struct DirSlot {
  std::atomic<int> active{0};
  char path[PATH_MAX] = {};
};
constexpr int kDirSlots = 64;
DirSlot g_dirs[kDirSlots];
std::atomic<int> g_committing{0};  // > 0: a commit is renaming; signals wait for it
std::atomic<int> g_pending_signal{0};
std::atomic<bool> g_handlers_installed{false};

std::mutex& tmp_mutex() {
  static std::mutex m;
  return m;
}

void on_terminate(int sig) {
  if (g_committing.load() > 0) {  // let the commit finish (all or nothing); it re-raises
    g_pending_signal.store(sig);
    return;
  }
  for (TmpSlot& s : g_tmp)
    if (s.active.load(std::memory_order_acquire)) ::unlinkat(s.dirfd, s.name, 0);
  for (int i = kDirSlots; i-- > 0;)
    if (g_dirs[i].active.load(std::memory_order_acquire)) ::rmdir(g_dirs[i].path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered on return from the handler: the process ends as the signal says
}

// Installs the cleanup handlers where the signal still has its default action (an application's own
// handlers are left alone).
void install_term_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_handler = on_terminate;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      ::sigaction(sig, &sa, nullptr);
    }
    g_handlers_installed = true;
  });
}

int register_tmp(int dirfd, const std::string& name) {
  std::lock_guard<std::mutex> lock(tmp_mutex());
  for (int i = 0; i < kTmpSlots; ++i) {
    if (g_tmp[i].active.load()) continue;
    g_tmp[i].dirfd = dirfd;
    std::snprintf(g_tmp[i].name, sizeof g_tmp[i].name, "%s", name.c_str());
    g_tmp[i].active.store(1, std::memory_order_release);
    return i;
  }
  return -1;  // more than kTmpSlots pending outputs: still removed on errors, not on signals
}

void unregister_tmp(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(tmp_mutex());
  g_tmp[slot].active.store(0, std::memory_order_release);
}

int register_dir(const std::string& path) {
  std::lock_guard<std::mutex> lock(tmp_mutex());
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kDirSlots; ++i) {
    if (g_dirs[i].active.load()) continue;
    std::snprintf(g_dirs[i].path, sizeof g_dirs[i].path, "%s", path.c_str());
    g_dirs[i].active.store(1, std::memory_order_release);
    return i;
  }
  return -1;  // still removed on errors, not on signals
}

void unregister_dir(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(tmp_mutex());
  g_dirs[slot].active.store(0, std::memory_order_release);
}

void reraise_pending_signal() {
  if (g_committing.load() > 0) return;
  if (const int sig = g_pending_signal.exchange(0)) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

std::string random_suffix() {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char buf[12];
  if (::getrandom(buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf)) {
    std::random_device rd;
    for (auto& b : buf) b = static_cast<unsigned char>(rd());
  }
  std::string s;
  for (unsigned char b : buf) s += alphabet[b % 36];
  return s;
}

std::string errno_str() { return std::strerror(errno); }

struct Input {
  dev_t dev;
  ino_t ino;
  std::string label, path;
};

}  // namespace

struct OutputSet::Impl {
  struct Out {
    std::string path, label, dir, base, tmp;
    int dirfd = -1, fd = -1, slot = -1;
    dev_t dir_dev = 0;
    ino_t dir_ino = 0;
    bool exists = false;  // the target existed when added
    dev_t dev = 0;
    ino_t ino = 0;
    int done = 0;  // commit: 0 not yet, 1 exchanged with the old target, 2 created, 3 replaced (no backup)
  };
  struct Dir {
    std::string path;
    int slot = -1;
  };
  std::vector<Input> inputs;
  std::vector<Out> outs;
  std::vector<Dir> dirs;  // created by the set, in order of creation

  std::string who(const Out& o) const { return o.label + " " + o.path; }

  void check_against_inputs(const Out& o) const {
    if (!o.exists) return;
    for (const Input& in : inputs)
      check(!(in.dev == o.dev && in.ino == o.ino),
            who(o) + ": is the same file as " + in.label + " " + in.path + "; refusing to overwrite an input");
  }

  void remove_all() {
    for (Out& o : outs) {
      if (o.fd >= 0) ::close(o.fd);
      if (!o.tmp.empty() && o.done == 0) ::unlinkat(o.dirfd, o.tmp.c_str(), 0);
      unregister_tmp(o.slot);
      if (o.dirfd >= 0) ::close(o.dirfd);
    }
    outs.clear();
    for (size_t i = dirs.size(); i-- > 0;) {  // not committed: the directories created go too (empty now)
      ::rmdir(dirs[i].path.c_str());
      unregister_dir(dirs[i].slot);
    }
    dirs.clear();
  }
};

OutputSet::OutputSet() : impl_(std::make_unique<Impl>()) {}

OutputSet::~OutputSet() { impl_->remove_all(); }

void OutputSet::add_input(const std::string& path, const std::string& label) {
  if (path.empty()) return;
  check_no_nul(path, label);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // the reader reports missing inputs
  if (S_ISDIR(st.st_mode)) {
    add_input_dir(path, label);
    return;
  }
  impl_->inputs.push_back({st.st_dev, st.st_ino, label, path});
  for (const auto& o : impl_->outs) impl_->check_against_inputs(o);
}

void OutputSet::add_input_dir(const std::string& dir, const std::string& label) {
  if (dir.empty()) return;
  check_no_nul(dir, label);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    add_input(dir, label);
    return;
  }
  const int dfd = ::dirfd(d);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::fstatat(dfd, e->d_name, &st, 0) == 0 && !S_ISDIR(st.st_mode))
      impl_->inputs.push_back({st.st_dev, st.st_ino, label, dir + (dir.back() == '/' ? "" : "/") + name});
  }
  ::closedir(d);
  for (const auto& o : impl_->outs) impl_->check_against_inputs(o);
}

size_t OutputSet::add(const std::string& path, const std::string& label) {
  check(!path.empty(), label + ": empty output path");
  check_no_nul(path, label);
  Impl::Out o;
  o.path = path;
  o.label = label;
  const std::string who = impl_->who(o);
  const size_t slash = path.rfind('/');
  o.dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  o.base = slash == std::string::npos ? path : path.substr(slash + 1);
  check(!o.base.empty() && o.base != "." && o.base != "..", who + ": names a directory, expected a file");

  o.dirfd = fd_above_standard(::open(o.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC));
  if (o.dirfd < 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(ErrorCode::IO, who + ": directory " + o.dir + " does not exist");
    if (err == ENOTDIR) throw Error(ErrorCode::IO, who + ": " + o.dir + " is not a directory");
    throw Error(ErrorCode::IO, who + ": cannot open directory " + o.dir + " (" + std::strerror(err) + ")");
  }
  try {
    struct stat ds {};
    if (::fstat(o.dirfd, &ds) != 0)
      throw Error(ErrorCode::IO, who + ": cannot stat directory " + o.dir + " (" + errno_str() + ")");
    o.dir_dev = ds.st_dev;
    o.dir_ino = ds.st_ino;
    struct stat st {};
    if (::fstatat(o.dirfd, o.base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      check(!S_ISLNK(st.st_mode), who + ": is a symbolic link; outputs never write through or replace links "
                                        "(remove it, or give the path it points to)");
      check(!S_ISDIR(st.st_mode), who + ": is a directory, expected a file");
      check(S_ISREG(st.st_mode), who + ": is " + file_type_name(st.st_mode) +
                                     "; outputs must be regular files and this one is never replaced");
      o.exists = true;
      o.dev = st.st_dev;
      o.ino = st.st_ino;
    } else {
      check(errno == ENOENT, ErrorCode::IO, who + ": cannot stat (" + errno_str() + ")");
    }
    impl_->check_against_inputs(o);
    for (const auto& p : impl_->outs) {
      const bool same_name = p.dir_dev == o.dir_dev && p.dir_ino == o.dir_ino && p.base == o.base;
      const bool same_file = p.exists && o.exists && p.dev == o.dev && p.ino == o.ino;
      check(!same_name && !same_file, who + ": is the same file as " + impl_->who(p) + "; every output needs its own path");
    }
    // Reserve: an exclusive, unpredictable temporary name next to the target proves the directory writable.
    const std::string stem = o.base.size() > 200 ? o.base.substr(0, 200) : o.base;
    install_term_handlers();
    for (int attempt = 0; o.fd < 0; ++attempt) {
      const std::string tmp = "." + stem + "." + random_suffix() + ".tmp";
      o.fd = ::openat(o.dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (o.fd >= 0 && o.fd < 3) {  // never on a standard descriptor the process started without
        const int moved = fd_above_standard(o.fd);
        if (moved < 0) {
          const int err = errno;
          ::unlinkat(o.dirfd, tmp.c_str(), 0);
          o.fd = -1;
          throw Error(ErrorCode::IO,
                      who + ": cannot create a file in directory " + o.dir + " (" + std::strerror(err) + ")");
        }
        o.fd = moved;
      }
      if (o.fd >= 0) {
        o.tmp = tmp;
        o.slot = register_tmp(o.dirfd, tmp);
      } else if (errno != EEXIST || attempt >= 16) {
        throw Error(ErrorCode::IO,
                    who + ": cannot create a file in directory " + o.dir + " (open: " + errno_str() + ")");
      }
    }
  } catch (...) {
    if (o.fd >= 0) {
      ::close(o.fd);
      ::unlinkat(o.dirfd, o.tmp.c_str(), 0);
      unregister_tmp(o.slot);
    }
    ::close(o.dirfd);
    throw;
  }
  impl_->outs.push_back(std::move(o));
  return impl_->outs.size() - 1;
}

void OutputSet::create_dir(const std::string& dir, const std::string& label) {
  check(!dir.empty(), label + ": empty directory path");
  install_term_handlers();
  // Each missing component, outermost first.
  std::vector<std::string> missing;
  std::string p = dir;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  for (;;) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      check(S_ISDIR(st.st_mode), ErrorCode::IO,
            label + " " + dir + ": " + p + " is " + file_type_name(st.st_mode) + ", expected a directory");
      break;
    }
    check(errno == ENOENT, ErrorCode::IO, label + " " + dir + ": cannot stat " + p + " (" + errno_str() + ")");
    missing.push_back(p);
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos || slash == 0) break;
    p = p.substr(0, slash);
    while (p.size() > 1 && p.back() == '/') p.pop_back();
  }
  for (size_t k = missing.size(); k-- > 0;) {
    const std::string& m = missing[k];
    if (::mkdir(m.c_str(), 0777) != 0) {
      if (errno == EEXIST) continue;  // made by someone else meanwhile: used, never removed
      throw Error(ErrorCode::IO, label + " " + dir + ": cannot create directory " + m + " (" + errno_str() + ")");
    }
    impl_->dirs.push_back({m, register_dir(m)});
  }
}

void OutputSet::check_space(size_t i, double bytes, const std::string& stage, const std::string& parts) const {
  check(i < impl_->outs.size(), ErrorCode::Internal, "OutputSet::check_space: no output " + std::to_string(i));
  const Impl::Out& o = impl_->outs[i];
  struct statvfs vs {};
  if (::fstatvfs(o.dirfd, &vs) != 0) return;  // unknown: the writes report a full disk
  const double free_bytes = double(vs.f_bavail) * double(vs.f_frsize ? vs.f_frsize : vs.f_bsize);
  check(bytes <= free_bytes, ErrorCode::IO,
        stage + " needs about " + format_bytes(bytes) + " of disk (" + parts + ") but only " +
            format_bytes(free_bytes) + " is free in " + o.dir);
}

void OutputSet::write(size_t i, const void* data, size_t n) {
  check(i < impl_->outs.size() && impl_->outs[i].fd >= 0, ErrorCode::Internal,
        "OutputSet::write: no open output " + std::to_string(i));
  const Impl::Out& o = impl_->outs[i];
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::write(o.fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(ErrorCode::IO, o.path + ": write failed (" + (r < 0 ? errno_str() : std::string("no progress")) +
                                     "); no output was written");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

ByteSink OutputSet::sink(size_t i) {
  return [this, i](const void* data, size_t n) { write(i, data, n); };
}

size_t OutputSet::size() const { return impl_->outs.size(); }
const std::string& OutputSet::path(size_t i) const { return impl_->outs.at(i).path; }

void OutputSet::discard() { impl_->remove_all(); }

void OutputSet::commit() {
  auto& outs = impl_->outs;
  try {
    check_mapped_files();  // nothing computed from an input that changed under the run is committed
    for (auto& o : outs) {
      // (errno is read after the call: a check()'s message argument may be evaluated before its condition)
      if (::fsync(o.fd) != 0)
        throw Error(ErrorCode::IO, o.path + ": write failed (fsync: " + errno_str() + "); no output was written");
      const int fd = o.fd;
      o.fd = -1;  // closed even when close reports an error
      if (::close(fd) != 0)
        throw Error(ErrorCode::IO, o.path + ": write failed (close: " + errno_str() + "); no output was written");
    }
  } catch (...) {
    impl_->remove_all();
    throw;
  }
  ++g_committing;
  std::string failure;
  size_t failed_at = outs.size();
  for (size_t i = 0; i < outs.size() && failure.empty(); ++i) {
    auto& o = outs[i];
    struct stat st {};
    if (::fstatat(o.dirfd, o.base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
      failure = impl_->who(o) + ": became " + file_type_name(st.st_mode) + " during the run; not replaced";
    } else if (::renameat2(o.dirfd, o.tmp.c_str(), o.dirfd, o.base.c_str(), RENAME_EXCHANGE) == 0) {
      o.done = 1;
    } else if (errno == ENOENT && ::renameat2(o.dirfd, o.tmp.c_str(), o.dirfd, o.base.c_str(), RENAME_NOREPLACE) == 0) {
      o.done = 2;
    } else if ((errno == EINVAL || errno == ENOSYS) && ::renameat(o.dirfd, o.tmp.c_str(), o.dirfd, o.base.c_str()) == 0) {
      o.done = 3;  // no RENAME_EXCHANGE here: the old file cannot be restored
    } else {
      failure = impl_->who(o) + ": cannot rename the temporary file into place (rename: " + errno_str() + ")";
    }
    if (!failure.empty()) failed_at = i;
  }
  if (!failure.empty()) {
    bool restored = true;
    for (size_t j = failed_at; j-- > 0;) {
      auto& o = outs[j];
      if (o.done == 1) {  // swap back: the old file returns, ours goes to the temporary name
        if (::renameat2(o.dirfd, o.tmp.c_str(), o.dirfd, o.base.c_str(), RENAME_EXCHANGE) == 0) o.done = 0;
        else restored = false;
      } else if (o.done == 2) {
        ::unlinkat(o.dirfd, o.base.c_str(), 0);
      } else if (o.done == 3) {
        restored = false;
      }
    }
    --g_committing;
    impl_->remove_all();
    reraise_pending_signal();
    throw Error(ErrorCode::IO,
                failure + (restored ? "; no output was written" : "; some earlier outputs could not be restored"));
  }
  for (auto& o : outs)
    if (o.done == 1) ::unlinkat(o.dirfd, o.tmp.c_str(), 0);  // the old target, now under the temporary name
  for (auto& o : outs) ::fsync(o.dirfd);
  for (auto& d : impl_->dirs) {  // committed: the directories stay, their entries synced in their parents
    unregister_dir(d.slot);
    const size_t slash = d.path.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : d.path.substr(0, slash);
    const int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd >= 0) {
      ::fsync(pfd);
      ::close(pfd);
    }
  }
  impl_->dirs.clear();
  impl_->remove_all();
  --g_committing;
  reraise_pending_signal();
}

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce) {
  OutputSet set;
  const size_t i = set.add(path);
  produce(set.sink(i));
  set.commit();
}

}  // namespace alpamayo
