// A persistent pool owned by one backend instance: threads-1 workers plus the calling thread, which
// takes part as thread 0 (so layer taps run on the caller). One dispatch per step; the phases inside a
// step are separated by a spinning barrier, which is cheap when threads <= cores and yields otherwise.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace alpamayo::cpu {

// Sets the calling thread's OpenMP thread count (oneDNN here is built on OpenMP) for a scope; a no-op
// when the process has no OpenMP runtime loaded.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n);
  ~ScopedOmpThreads();
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_ = 0;
};

// Work items [front, back) that their owner takes from the front and other threads from the back (the cpu
// backend's work stealing over matmul chunks). Both ends live in one word, so a claim is one compare-and-swap
// and no item is taken twice or lost. reset() must not race with take_*() (callers separate them by a barrier).
class alignas(64) StealQueue {
 public:
  void reset(uint32_t front, uint32_t back) { word_.store(uint64_t(back) << 32 | front, std::memory_order_relaxed); }
  // The item taken, or -1 when none is left.
  int take_front() { return take(false); }
  int take_back() { return take(true); }

 private:
  int take(bool back_end);
  std::atomic<uint64_t> word_{0};
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }
  // Runs fn(tid) on every thread (tid 0 = caller) and waits. The first exception is rethrown here.
  // fn must not throw between barriers (the other threads would wait forever).
  void run(const std::function<void(int)>& fn);
  // Waits until all threads of the current run() arrive.
  void barrier();

 private:
  void worker(int tid);
  void call(int tid);

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::atomic<int> pending_{0};
  std::exception_ptr error_;
  std::mutex error_mu_;
  alignas(64) std::atomic<int> bar_count_{0};
  alignas(64) std::atomic<uint32_t> bar_gen_{0};
};

}  // namespace alpamayo::cpu
