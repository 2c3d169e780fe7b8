#include "io/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "alpamayo/error.h"
#include "io/inputs.h"

namespace alpamayo {
namespace {

// Address ranges of live mappings, read lock-free by the signal handler.
struct Slot {
  std::atomic<uintptr_t> lo{0}, hi{0};
  std::atomic<int> faulted{0};
};
constexpr int kSlots = 1024;
Slot g_slots[kSlots];
bool g_slot_used[kSlots];  // guarded by registry_mutex()
std::set<const MappedFile*> g_files;  // guarded by registry_mutex()
struct sigaction g_prev_bus;

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

void on_sigbus(int sig, siginfo_t* si, void* uc) {
  const int saved_errno = errno;
  if (si != nullptr && si->si_code > 0) {  // a fault, not a signal sent with kill()
    const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
    for (Slot& s : g_slots) {
      const uintptr_t lo = s.lo.load(std::memory_order_acquire);
      const uintptr_t hi = s.hi.load(std::memory_order_acquire);
      if (lo == 0 || a < lo || a >= hi) continue;
      s.faulted.store(1, std::memory_order_release);
      // Zero pages in place of the whole file: the faulting read (and any later one) completes, and
      // check_intact() reports the file before anything computed from it is written.
      void* r = ::mmap(reinterpret_cast<void*>(lo), hi - lo, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      errno = saved_errno;
      if (r != MAP_FAILED) return;
      break;
    }
  }
  errno = saved_errno;
  // Not ours: the previous handler, else the default action.
  if (g_prev_bus.sa_flags & SA_SIGINFO) {
    if (g_prev_bus.sa_sigaction != nullptr) {
      g_prev_bus.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN) {
    g_prev_bus.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // a fault re-executes the access and dies with SIGBUS; a sent signal is re-raised
  if (si == nullptr || si->si_code <= 0) ::raise(SIGBUS);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    ::sigaction(SIGBUS, &sa, &g_prev_bus);
  });
}

int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  struct stat st {};
  fd_ = open_regular_file(path, &st);
  size_ = static_cast<size_t>(st.st_size);
  mtime_ns_ = mtime_ns(st);
  if (size_ == 0) return;
  install_sigbus_handler();
  int slot = -1;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (int i = 0; i < kSlots && slot < 0; ++i)
      if (!g_slot_used[i]) slot = i;
    if (slot >= 0) g_slot_used[slot] = true;
  }
  void* m = slot >= 0 ? ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0) : MAP_FAILED;
  if (m == MAP_FAILED) {
    // No free slot (more than kSlots files mapped) or a file system without mmap: read it instead.
    if (slot >= 0) {
      std::lock_guard<std::mutex> lock(registry_mutex());
      g_slot_used[slot] = false;
    }
    bytes_.resize(size_);
    size_t got = 0;
    while (got < size_) {
      const ssize_t r = ::pread(fd_, bytes_.data() + got, size_ - got, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const std::string why = r < 0 ? std::strerror(errno) : "the file shrank while being read";
        ::close(fd_);
        throw Error(ErrorCode::IO, path + ": read failed (" + why + ")");
      }
      got += static_cast<size_t>(r);
    }
    struct stat after {};
    const bool same = ::fstat(fd_, &after) == 0 && static_cast<size_t>(after.st_size) == size_ && mtime_ns(after) == mtime_ns_;
    ::close(fd_);
    fd_ = -1;  // a private copy from here on: later changes to the file do not matter
    check(same, ErrorCode::IO, path + ": the file was modified while being read");
    data_ = reinterpret_cast<const uint8_t*>(bytes_.data());
  } else {
    map_ = m;
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    map_len_ = (size_ + page - 1) / page * page;
    slot_ = slot;
    Slot& s = g_slots[slot];
    s.faulted.store(0, std::memory_order_relaxed);
    s.hi.store(reinterpret_cast<uintptr_t>(m) + map_len_, std::memory_order_release);
    s.lo.store(reinterpret_cast<uintptr_t>(m), std::memory_order_release);
    data_ = static_cast<const uint8_t*>(m);
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  g_files.insert(this);
}

MappedFile::MappedFile(std::string bytes, std::string name) : path_(std::move(name)), bytes_(std::move(bytes)) {
  data_ = reinterpret_cast<const uint8_t*>(bytes_.data());
  size_ = bytes_.size();
}

MappedFile::~MappedFile() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    g_files.erase(this);
    if (slot_ >= 0) {
      g_slots[slot_].lo.store(0, std::memory_order_release);
      g_slots[slot_].hi.store(0, std::memory_order_release);
      g_slot_used[slot_] = false;
    }
  }
  if (map_ != nullptr) ::munmap(map_, map_len_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::check_intact() const {
  if (fd_ < 0) return;  // an in-memory image
  check(slot_ < 0 || g_slots[slot_].faulted.load(std::memory_order_acquire) == 0, ErrorCode::IO,
        path_ +
            ": the file was truncated while in use (it is memory-mapped and a read found data missing); "
            "nothing computed from it is written");
  struct stat st {};
  if (::fstat(fd_, &st) == 0)
    check(static_cast<size_t>(st.st_size) == size_ && mtime_ns(st) == mtime_ns_, ErrorCode::IO,
          path_ + ": the file was modified while in use (" +
              (static_cast<size_t>(st.st_size) != size_
                   ? "size " + std::to_string(size_) + " -> " + std::to_string(st.st_size) + " bytes"
                   : std::string("modification time changed")) +
              "); nothing computed from it is written");
}

void check_mapped_files() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const MappedFile* f : g_files) f->check_intact();
}

}  // namespace alpamayo
