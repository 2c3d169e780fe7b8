#include "backends/cpu/profile/peaks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <cstdio>

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
  for (const char* i : {"vpdpbusd zmm", "vpdpbusd ymm", "vpmaddwd ymm"})
    if (of(i) > best) {
      best = of(i);
      if (which) *which = i;
    }
  return best;
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

std::mutex peaks_mu;
std::map<int, Peaks>& peaks_cache() {
  static std::map<int, Peaks> cache;  // node-based: references to its values stay valid
  return cache;
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

const Peaks& measured_peaks(int threads) {
  threads = resolve_threads(threads);
  std::lock_guard<std::mutex> lk(peaks_mu);
  std::map<int, Peaks>& cache = peaks_cache();
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  const std::vector<Spec> sp = specs();
  Peaks p;
  p.threads = threads;
  for (const Spec& s : sp) {
    PeakEntry e{s.instruction, s.unit, 0.0, ""};
    if (!isa().has(s.need)) e.why_not = "needs " + isa_names(s.need & ~isa().usable);
    p.entries.push_back(e);
  }
  measure_passes(sp, threads, p);
  return cache[threads] = p;
}

const Peaks& remeasure_peaks(int threads) {
  threads = resolve_threads(threads);
  measured_peaks(threads);
  std::lock_guard<std::mutex> lk(peaks_mu);
  Peaks& p = peaks_cache()[threads];
  measure_passes(specs(), threads, p);
  return p;
}

}  // namespace alpamayo::cpu

namespace alpamayo::cpu {

StepWork step_work(int L, int D, int Hq, int Hkv, int d, int I, int T, const std::vector<long long>& attended) {
  StepWork w;
  const double M = double(T) * attended.size();
  const double params = double(D) * (Hq + 2 * Hkv) * d + double(Hq) * d * D + 3.0 * D * I;  // qkv, o, gate+up, down
  w.matmul_gflop = 2.0 * M * params * L * 1e-9;
  double keys = 0;
  for (long long a : attended) keys += double(a);
  w.attention_gflop = 4.0 * T * Hq * d * keys * L * 1e-9;
  return w;
}

std::vector<OpFloor> step_floors(const StepWork& w, const KernelChoices& choices, const std::string& weights,
                                 int threads, bool kv_int8) {
  const Peaks& p = measured_peaks(threads);
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
      f.peak = i8 ? p.best_int8_unit(&which) : p.best_bf16_unit(&which);
      f.instruction = "best: " + which;
    }
    out.push_back(f);
  }
  {
    const KernelChoice c = chosen(kv_int8 ? "attention_kv_int8" : "attention");
    OpFloor f{c.op, c.kernel, c.instruction, w.attention_gflop};
    f.peak = c.instruction.empty() ? 0 : p.of(c.instruction);
    if (f.peak <= 0) {
      std::string which;
      f.peak = p.best_bf16_unit(&which);
      f.instruction = (c.instruction.empty() ? "" : c.instruction + ", held to ") + "best: " + which;
    }
    out.push_back(f);
  }
  for (OpFloor& f : out) f.floor_ms = f.peak > 0 ? 1e3 * f.gflop / f.peak : 0;
  return out;
}

std::string format_floors(const std::vector<OpFloor>& f, int threads, const std::string& indent) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s%-14s %-12s %-28s %10s %12s %10s %10s %8s\n", indent.c_str(), "op", "kernel",
                "instruction", "GFLOP/step", "peak GFLOP/s", "floor ms", "actual ms", "of peak");
  s += buf;
  double gf = 0, floor = 0, actual = 0;
  bool all_actual = true;
  for (const OpFloor& o : f) {
    char act[32] = "-", frac[32] = "-";
    if (o.actual_ms > 0) {
      std::snprintf(act, sizeof act, "%.2f", o.actual_ms);
      std::snprintf(frac, sizeof frac, "%.1f%%", 100.0 * o.floor_ms / o.actual_ms);
    }
    std::snprintf(buf, sizeof buf, "%s%-14s %-12s %-28s %10.2f %12.1f %10.2f %10s %8s\n", indent.c_str(), o.op.c_str(),
                  o.kernel.empty() ? "-" : o.kernel.c_str(), o.instruction.c_str(), o.gflop, o.peak, o.floor_ms, act,
                  frac);
    s += buf;
    gf += o.gflop;
    floor += o.floor_ms;
    actual += o.actual_ms;
    all_actual = all_actual && o.actual_ms > 0;
  }
  char act[32] = "-", frac[32] = "-";
  if (all_actual && actual > 0) {
    std::snprintf(act, sizeof act, "%.2f", actual);
    std::snprintf(frac, sizeof frac, "%.1f%%", 100.0 * floor / actual);
  }
  std::snprintf(buf, sizeof buf, "%s%-14s %-12s %-28s %10.2f %12s %10.2f %10s %8s  (peaks on %d threads)\n",
                indent.c_str(), "floor", "", "", gf, "", floor, act, frac, threads);
  s += buf;
  return s;
}

}  // namespace alpamayo::cpu
