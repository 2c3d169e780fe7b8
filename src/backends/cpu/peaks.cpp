#include "backends/cpu/peaks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cpu/isa.h"

namespace alpamayo::cpu {
namespace {

using Loop = float (*)(long, float, double*);
using Clock = std::chrono::steady_clock;

std::atomic<float> sink{0.f};  // keeps the loops' results alive

// Seconds for `iters` iterations on `threads` threads started together (the slowest thread's end).
double run_on(Loop loop, long iters, int threads, double* ops_per_iter) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<double> ends(threads);
  Clock::time_point start;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      double opi = 0;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const float r = loop(iters, 1.f + t, &opi);
      ends[t] = std::chrono::duration<double>(Clock::now() - start).count();
      sink.store(sink.load(std::memory_order_relaxed) + r, std::memory_order_relaxed);
      if (t == 0) *ops_per_iter = opi;
    });
  while (ready.load() < threads) std::this_thread::yield();
  start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return *std::max_element(ends.begin(), ends.end());
}

// Rate (ops/s) of one loop on `threads` threads, each thread running about `seconds`.
double measure(Loop loop, int threads, double seconds) {
  double opi = 0;
  long iters = 1 << 12;
  // Calibrate on one thread until a run takes >= 5 ms, then size the measured runs.
  for (double s = 0; (s = run_on(loop, iters, 1, &opi)) < 5e-3;) iters = s < 1e-4 ? iters * 16 : iters * 2;
  const double per_iter = run_on(loop, iters, 1, &opi) / iters;
  const long n = std::max(1L, static_cast<long>(seconds / per_iter));
  double best = 0;
  for (int rep = 0; rep < 2; ++rep) best = std::max(best, opi * n * threads / run_on(loop, n, threads, &opi));
  return best;
}

}  // namespace

double Peaks::of(const std::string& instruction) const {
  for (const PeakEntry& e : entries)
    if (e.instruction == instruction) return e.rate;
  return 0;
}

double Peaks::best_bf16_unit(std::string* which) const {
  double best = 0;
  for (const char* i : {"vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm"})
    if (of(i) > best) {
      best = of(i);
      if (which) *which = i;
    }
  return best;
}

double Peaks::best_int8_unit(std::string* which) const {
  double best = 0;
  for (const char* i : {"vpdpbusd zmm", "vpdpbusd ymm"})
    if (of(i) > best) {
      best = of(i);
      if (which) *which = i;
    }
  return best;
}

const Peaks& measured_peaks(int threads) {
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  static std::mutex mu;
  static std::map<int, Peaks> cache;
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  const IsaInfo& i = isa();
  struct Spec {
    const char* instruction;
    const char* unit;
    uint32_t need;
    Loop loop;
  };
  // vpdpbusd ymm: the VEX form (AVX-VNNI) where offered, else the EVEX form (AVX512-VNNI + VL).
  const bool vex_vnni = i.has(kAvxVnni);
  const Spec specs[] = {
      {"vdpbf16ps zmm", "GFLOP/s", kAvx512 | kAvx512Bf16, peak_loop_dpbf16_zmm},
      {"vfmadd231ps zmm", "GFLOP/s", kAvx512, peak_loop_fma_zmm},
      {"vfmadd231ps ymm", "GFLOP/s", kAvx2Fma, peak_loop_fma_ymm},
      {"vpdpbusd zmm", "GOP/s", kAvx512 | kAvx512Vnni, peak_loop_dpbusd_zmm},
      {"vpdpbusd ymm", "GOP/s", vex_vnni ? uint32_t(kAvx2Fma | kAvxVnni) : uint32_t(kAvx512 | kAvx512Vnni),
       vex_vnni ? peak_loop_dpbusd_ymm_vex : peak_loop_dpbusd_ymm_evex},
  };
  Peaks p;
  p.threads = threads;
  for (const Spec& s : specs) {
    PeakEntry e{s.instruction, s.unit, 0.0, ""};
    if (i.has(s.need))
      e.rate = measure(s.loop, threads, 0.05) * 1e-9;
    else
      e.why_not = "needs " + isa_names(s.need & ~i.usable);
    p.entries.push_back(e);
  }
  return cache[threads] = p;
}

}  // namespace alpamayo::cpu
