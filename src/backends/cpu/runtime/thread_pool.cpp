#include "backends/cpu/runtime/thread_pool.h"

#include <dlfcn.h>

namespace alpamayo::cpu {
namespace {

// oneDNN's libgomp is loaded with it but not on our link line, so its entry points are looked up.
using GetFn = int (*)();
using SetFn = void (*)(int);
GetFn omp_get() { return reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads")); }
SetFn omp_set() { return reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")); }

}  // namespace

ScopedOmpThreads::ScopedOmpThreads(int n) {
  if (GetFn g = omp_get()) saved_ = g();
  if (SetFn s = omp_set()) s(n);
}

ScopedOmpThreads::~ScopedOmpThreads() {
  if (SetFn s = omp_set(); s && saved_ > 0) s(saved_);
}

ThreadPool::ThreadPool(int threads) : n_(threads < 1 ? 1 : threads) {
  for (int t = 1; t < n_; ++t) workers_.emplace_back([this, t] { worker(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::call(int tid) {
  try {
    (*job_)(tid);
  } catch (...) {
    std::lock_guard<std::mutex> lk(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker(int tid) {
  // Each worker runs its oneDNN primitives single-threaded: the pool does the parallel split.
  if (SetFn s = omp_set()) s(1);
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    call(tid);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  error_ = nullptr;
  job_ = &fn;
  pending_.store(n_ - 1, std::memory_order_release);
  if (n_ > 1) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++generation_;
    }
    cv_.notify_all();
  }
  call(0);
  if (n_ > 1) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

int StealQueue::take(bool back_end) {
  uint64_t v = word_.load(std::memory_order_relaxed);
  for (;;) {
    const uint32_t front = uint32_t(v), back = uint32_t(v >> 32);
    if (front >= back) return -1;
    const uint64_t next = back_end ? uint64_t(back - 1) << 32 | front : uint64_t(back) << 32 | (front + 1);
    if (word_.compare_exchange_weak(v, next, std::memory_order_relaxed)) return int(back_end ? back - 1 : front);
  }
}

void ThreadPool::barrier() {
  if (n_ == 1) return;
  const uint32_t gen = bar_gen_.load(std::memory_order_acquire);
  if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
    bar_count_.store(0, std::memory_order_relaxed);
    bar_gen_.store(gen + 1, std::memory_order_release);
    return;
  }
  for (int spin = 0; bar_gen_.load(std::memory_order_acquire) == gen; ++spin)
    if (spin > 2000) std::this_thread::yield();
    else __builtin_ia32_pause();
}

}  // namespace alpamayo::cpu
