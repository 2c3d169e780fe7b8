#include "backends/cpu/profile/peaks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {
namespace {

using Loop = float (*)(long, float, double*);
using Clock = std::chrono::steady_clock;

std::atomic<float> sink{0.f};  // keeps the loops' results alive

// `iters` iterations on each of `threads` threads started together; returns the sum over the threads of
// their rates (iterations per second of their own CPU time: other processes on a shared machine take turns
// on the cores without lowering it) and sets the slowest thread's CPU seconds.
double run_on(Loop loop, long iters, int threads, double* ops_per_iter, double* slowest) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<double> cpu(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      double opi = 0;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double c0 = thread_cpu_seconds();
      const float r = loop(iters, 1.f + t, &opi);
      cpu[t] = thread_cpu_seconds() - c0;
      sink.store(sink.load(std::memory_order_relaxed) + r, std::memory_order_relaxed);
      if (t == 0) *ops_per_iter = opi;
    });
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  double rate = 0;
  *slowest = 0;
  for (double c : cpu) {
    rate += iters / std::max(c, 1e-9);
    *slowest = std::max(*slowest, c);
  }
  return rate;
}

// Iterations of `loop` that take one thread about `seconds` (calibrated until a run takes >= 5 ms).
long iterations_for(Loop loop, double seconds) {
  double opi = 0, s = 0;
  long iters = 1 << 12;
  for (run_on(loop, iters, 1, &opi, &s); s < 5e-3; run_on(loop, iters, 1, &opi, &s))
    iters = s < 1e-4 ? iters * 16 : iters * 2;
  return std::max(1L, static_cast<long>(seconds / (s / iters)));
}

// Rate (ops/s) of one run of n iterations on `threads` threads.
double measure_once(Loop loop, long n, int threads) {
  double opi = 0, s = 0;
  const double rate = run_on(loop, n, threads, &opi, &s);
  return opi * rate;
}

}  // namespace

double Peaks::of(const std::string& instruction) const {
  if (const size_t plus = instruction.find(" + "); plus != std::string::npos) {
    const double a = of(instruction.substr(0, plus)), b = of(instruction.substr(plus + 3));
    return a > 0 && b > 0 ? 2.0 / (1.0 / a + 1.0 / b) : 0.0;
  }
  for (const PeakEntry& e : entries)
    if (e.instruction == instruction) return e.rate;
  return 0;
}

namespace {

// The fastest of `names` among the entries that execute within `usable`.
template <size_t N>
double best_of(const std::vector<PeakEntry>& entries, const char* const (&names)[N], uint32_t usable,
               std::string* which) {
  double best = 0;
  for (const char* i : names)
    for (const PeakEntry& e : entries)
      if (e.instruction == i && (e.need & ~usable) == 0 && e.rate > best) {
        best = e.rate;
        if (which) *which = i;
      }
  return best;
}

}  // namespace

double Peaks::best_bf16_unit(std::string* which, uint32_t usable) const {
  static const char* const names[] = {"tdpbf16ps tmm", "vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm"};
  return best_of(entries, names, usable, which);
}

double Peaks::best_int8_unit(std::string* which, uint32_t usable) const {
  static const char* const names[] = {"tdpbusd tmm", "vpdpbusd zmm", "vpdpbusd ymm", "vpmaddwd ymm"};
  return best_of(entries, names, usable, which);
}

namespace {

struct Spec {
  const char* instruction;
  const char* unit;
  uint32_t need;
  Loop loop;
};

std::vector<Spec> specs() {
  const IsaInfo& i = isa();
  // vpdpbusd ymm: the VEX form (AVX-VNNI) where offered, else the EVEX form (AVX512-VNNI + VL).
  const bool vex_vnni = i.has(kAvxVnni);
  return {
      {"tdpbf16ps tmm", "GFLOP/s", kAvx512 | kAmxBf16, peak_loop_amx_bf16},
      {"tdpbusd tmm", "GOP/s", kAvx512 | kAmxInt8, peak_loop_amx_int8},
      {"vdpbf16ps zmm", "GFLOP/s", kAvx512 | kAvx512Bf16, peak_loop_dpbf16_zmm},
      {"vfmadd231ps zmm", "GFLOP/s", kAvx512, peak_loop_fma_zmm},
      {"vfmadd231ps ymm", "GFLOP/s", kAvx2Fma, peak_loop_fma_ymm},
      {"vpdpbusd zmm", "GOP/s", kAvx512 | kAvx512Vnni, peak_loop_dpbusd_zmm},
      {"vpdpwssd zmm", "GOP/s", kAvx512 | kAvx512Vnni, peak_loop_dpwssd_zmm},
      {"vpdpbusd ymm", "GOP/s", vex_vnni ? uint32_t(kAvx2Fma | kAvxVnni) : uint32_t(kAvx512 | kAvx512Vnni),
       vex_vnni ? peak_loop_dpbusd_ymm_vex : peak_loop_dpbusd_ymm_evex},
      {"vpmaddwd ymm", "GOP/s", kAvx2Fma, peak_loop_maddwd_ymm},
  };
}

// Three runs of 25 ms per instruction, taken in turn over the instructions, each entry keeping its best: on a
// shared machine a neighbour's burst then has to span the whole ~0.4 s to lower a peak (two back-to-back runs
// once measured every peak a third low, and the step's floor with them).
void measure_passes(const std::vector<Spec>& sp, int threads, Peaks& p) {
  std::vector<long> iters;
  for (const Spec& s : sp) iters.push_back(isa().has(s.need) ? iterations_for(s.loop, 0.025) : 0);
  for (int pass = 0; pass < 3; ++pass)
    for (size_t k = 0; k < sp.size(); ++k)
      if (iters[k] > 0)
        p.entries[k].rate = std::max(p.entries[k].rate, measure_once(sp[k].loop, iters[k], threads) * 1e-9);
}

// Portable fallback of read_loop_avx512: 8 independent 64-bit streams (vectorised by the compiler).
uint64_t read_loop_portable(const void* p, size_t bytes) {
  const uint64_t* v = static_cast<const uint64_t*>(p);
  uint64_t a[8] = {};
  for (size_t i = 0; i + 8 <= bytes / 8; i += 8)
    for (int j = 0; j < 8; ++j) a[j] ^= v[i + j];
  return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

size_t bandwidth_buffer_bytes() {
  long l3 = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  const size_t gib = size_t(1) << 30;
  return std::min(4 * gib, std::max(gib, 4 * static_cast<size_t>(std::max(0L, l3))));
}

std::mutex peaks_mu;
std::map<int, Peaks>& peaks_cache() {
  static std::map<int, Peaks> cache;  // node-based: references to its values stay valid
  return cache;
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

double read_bandwidth_gbs(int threads) {
  threads = std::max(1, threads);
  const size_t bytes = bandwidth_buffer_bytes();
  void* buf = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) return 0;
#ifdef MADV_HUGEPAGE
  madvise(buf, bytes, MADV_HUGEPAGE);  // fewer TLB misses, as the weights (huge_buf.h) have
#endif
  // Each thread first touches (non-zero: no shared zero page) and then reads its own contiguous part.
  const size_t part = bytes / threads / 256 * 256;
  const bool avx512 = isa().has(kAvx512);
  std::vector<double> best(threads, 0.0);
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      char* p = static_cast<char*>(buf) + t * part;
      std::memset(p, 0x5a + t, part);
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();  // every part touched before any is timed
      uint64_t r = 0;
      for (int pass = 0; pass < 2; ++pass) {
        const double c0 = thread_cpu_seconds();
        r ^= avx512 ? read_loop_avx512(p, part) : read_loop_portable(p, part);
        best[t] = std::max(best[t], part / std::max(thread_cpu_seconds() - c0, 1e-9));
      }
      sink.store(sink.load(std::memory_order_relaxed) + static_cast<float>(r & 1), std::memory_order_relaxed);
    });
  for (auto& th : pool) th.join();
  munmap(buf, bytes);
  double sum = 0;
  for (double b : best) sum += b;  // per-thread CPU time, as the peaks: a neighbour's turn on a core is not counted
  return sum * 1e-9;
}

const Peaks& measured_peaks(int threads) {
  threads = resolve_threads(threads);
  std::lock_guard<std::mutex> lk(peaks_mu);
  std::map<int, Peaks>& cache = peaks_cache();
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  const std::vector<Spec> sp = specs();
  Peaks p;
  p.threads = threads;
  for (const Spec& s : sp) {
    PeakEntry e{s.instruction, s.unit, 0.0, "", s.need};
    if (!isa().has(s.need)) e.why_not = "needs " + isa_names(s.need & ~isa().usable);
    p.entries.push_back(e);
  }
  measure_passes(sp, threads, p);
  p.read_gbs = read_bandwidth_gbs(threads);
  return cache[threads] = p;
}

const Peaks& remeasure_peaks(int threads) {
  threads = resolve_threads(threads);
  measured_peaks(threads);
  std::lock_guard<std::mutex> lk(peaks_mu);
  Peaks& p = peaks_cache()[threads];
  measure_passes(specs(), threads, p);
  p.read_gbs = std::max(p.read_gbs, read_bandwidth_gbs(threads));
  return p;
}

}  // namespace alpamayo::cpu

namespace alpamayo::cpu {

double weight_bytes_per_param(const std::string& weights) {
  if (weights == "int8") return 1.0;
  if (weights == "bfp8_b") return 1.0625;
  if (weights == "bfp4_b") return 0.5625;
  return 2.0;
}

StepWork step_work(int L, int D, int Hq, int Hkv, int d, int I, int T, const std::vector<long long>& attended,
                   const std::string& weights, bool kv_int8, long long cache_rows) {
  StepWork w;
  const double M = double(T) * attended.size();
  const double wb = weight_bytes_per_param(weights);
  const double xb = weights == "int8" ? 1.0 : 2.0;  // the matmuls' inputs: int8 or bf16 rows; outputs fp32
  struct Shape {
    const char* phase;
    double K, N;
  };
  const Shape shapes[] = {{"qkv", double(D), double(Hq + 2 * Hkv) * d},
                          {"o_proj", double(Hq) * d, double(D)},
                          {"gate_up", double(D), 2.0 * I},
                          {"down", double(I), double(D)}};
  for (const Shape& s : shapes) {
    PhaseWork ph{s.phase, 2.0 * M * s.K * s.N * L * 1e-9, (s.K * s.N * wb + M * s.K * xb + M * s.N * 4.0) * L * 1e-9};
    w.matmul_gflop += ph.gflop;
    w.matmul_gbytes += ph.gbytes;
    w.matmul_weight_gbytes += s.K * s.N * wb * L * 1e-9;
    w.matmul_phases.push_back(ph);
  }
  double keys = 0;
  for (long long a : attended) keys += double(a);
  w.attention_gflop = 4.0 * T * Hq * d * keys * L * 1e-9;
  const double rows = cache_rows >= 0 ? double(cache_rows) : keys;
  w.attention_gbytes = rows * 2.0 * Hkv * d * (kv_int8 ? 1.0 : 2.0) * L * 1e-9;  // K and V
  return w;
}

namespace {

// One phase's roofline into f: compute and memory times, and the larger of the two added to the floor.
void add_phase(OpFloor& f, double gflop, double gbytes) {
  const double c = f.peak > 0 ? 1e3 * gflop / f.peak : 0, m = f.read_gbs > 0 ? 1e3 * gbytes / f.read_gbs : 0;
  f.compute_ms += c;
  f.memory_ms += m;
  f.floor_ms += std::max(c, m);
}

}  // namespace

std::vector<OpFloor> step_floors(const StepWork& w, const KernelChoices& choices, const std::string& weights,
                                 const Peaks& p, bool kv_int8, uint32_t usable) {
  auto chosen = [&](const std::string& op) {
    for (const KernelChoice& c : choices)
      if (c.op == op) return c;
    return KernelChoice{op, "", "", 0.0, ""};
  };
  std::vector<OpFloor> out;
  {
    const bool i8 = weights == "int8";
    const std::string op = i8 ? "matmul_int8" : weights == "bf16" ? "matmul_bf16" : "matmul_" + weights;
    const KernelChoice c = chosen(op);
    OpFloor f{op, c.kernel.empty() ? (i8 || weights == "bf16" ? "onednn" : "block") : c.kernel, c.instruction,
              w.matmul_gflop};
    f.peak = c.instruction.empty() ? 0 : p.of(c.instruction);
    if (f.peak <= 0) {
      std::string which;
      f.peak = i8 ? p.best_int8_unit(&which, usable) : p.best_bf16_unit(&which, usable);
      f.instruction = "best: " + which;
    }
    f.gbytes = w.matmul_gbytes;
    f.read_gbs = p.read_gbs;
    for (const PhaseWork& ph : w.matmul_phases) add_phase(f, ph.gflop, ph.gbytes);
    out.push_back(f);
  }
  {
    const KernelChoice c = chosen(kv_int8 ? "attention_kv_int8" : "attention");
    OpFloor f{c.op, c.kernel, c.instruction, w.attention_gflop};
    f.peak = c.instruction.empty() ? 0 : p.of(c.instruction);
    if (f.peak <= 0) {  // the fastest unit (an int8 cache: int8 units too)
      std::string which, which8;
      f.peak = p.best_bf16_unit(&which, usable);
      if (kv_int8 && p.best_int8_unit(&which8, usable) > f.peak) f.peak = p.best_int8_unit(nullptr, usable), which = which8;
      f.instruction = (c.instruction.empty() ? "" : c.instruction + ", held to ") + "best: " + which;
    }
    f.gbytes = w.attention_gbytes;
    f.read_gbs = p.read_gbs;
    add_phase(f, w.attention_gflop, w.attention_gbytes);
    out.push_back(f);
  }
  return out;
}

std::vector<OpFloor> step_floors(const StepWork& w, const KernelChoices& choices, const std::string& weights,
                                 int threads, bool kv_int8, uint32_t usable) {
  return step_floors(w, choices, weights, measured_peaks(threads), kv_int8, usable);
}

std::string format_floors(const std::vector<OpFloor>& f, int threads, const std::string& indent) {
  std::string s;
  char buf[512];
  // "of floor": floor time / measured time (100%: the step ran at the roofline).
  std::snprintf(buf, sizeof buf, "%s%-14s %-12s %-24s %10s %12s %9s %8s %10s %10s %-7s %10s %10s %8s\n",
                indent.c_str(), "op", "kernel", "instruction", "GFLOP/step", "peak GFLOP/s", "GB/step", "GB/s",
                "compute ms", "memory ms", "bound", "floor ms", "actual ms", "of floor");
  s += buf;
  double gf = 0, gb = 0, floor = 0, actual = 0, bw = 0;
  bool all_actual = true;
  for (const OpFloor& o : f) {
    char act[32] = "-", frac[32] = "-";
    if (o.actual_ms > 0) {
      std::snprintf(act, sizeof act, "%.2f", o.actual_ms);
      std::snprintf(frac, sizeof frac, "%.1f%%", 100.0 * o.floor_ms / o.actual_ms);
    }
    std::snprintf(buf, sizeof buf,
                  "%s%-14s %-12s %-24s %10.2f %12.1f %9.3f %8.1f %10.2f %10.2f %-7s %10.2f %10s %8s\n",
                  indent.c_str(), o.op.c_str(), o.kernel.empty() ? "-" : o.kernel.c_str(), o.instruction.c_str(),
                  o.gflop, o.peak, o.gbytes, o.read_gbs, o.compute_ms, o.memory_ms, o.bound(), o.floor_ms, act, frac);
    s += buf;
    gf += o.gflop;
    gb += o.gbytes;
    floor += o.floor_ms;
    actual += o.actual_ms;
    bw = std::max(bw, o.read_gbs);
    all_actual = all_actual && o.actual_ms > 0;
  }
  char act[32] = "-", frac[32] = "-";
  if (all_actual && actual > 0) {
    std::snprintf(act, sizeof act, "%.2f", actual);
    std::snprintf(frac, sizeof frac, "%.1f%%", 100.0 * floor / actual);
  }
  std::snprintf(buf, sizeof buf,
                "%s%-14s %-12s %-24s %10.2f %12s %9.3f %8s %10s %10s %-7s %10.2f %10s %8s  (peaks and %.1f GB/s read "
                "bandwidth on %d threads)\n",
                indent.c_str(), "floor", "", "", gf, "", gb, "", "", "", "", floor, act, frac, bw, threads);
  s += buf;
  return s;
}

}  // namespace alpamayo::cpu
