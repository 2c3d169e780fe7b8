// Peak throughput of the instructions the kernels multiply with, measured on this machine in register-only
// loops (no memory traffic): the ceilings against which the benchmarks and --profile state each op's floor
// and achieved fraction. Each loop runs about 50 ms on every thread at once; results are cached per thread
// count for the process. An instruction the CPU (or ALPAMAYO_CPU_ISA) does not offer reads 0.
#pragma once
#include <string>
#include <vector>

namespace alpamayo::cpu {

struct PeakEntry {
  std::string instruction;  // "vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm", "vpdpbusd zmm", ...
  std::string unit;         // "GFLOP/s" (a multiply-add is 2 flops) or "GOP/s" (int8)
  double rate = 0;          // all threads together; 0: not runnable here
  std::string why_not;      // when rate == 0
};

struct Peaks {
  int threads = 0;
  std::vector<PeakEntry> entries;
  // The rate of an instruction (as in KernelChoice::instruction); 0 if unknown or not runnable.
  double of(const std::string& instruction) const;
  // The fastest of the fp32-capable units for bf16 operands: max(vdpbf16ps zmm, vfmadd231ps zmm, ymm).
  double best_bf16_unit(std::string* which = nullptr) const;
  // The fastest int8 unit: max(vpdpbusd zmm, ymm).
  double best_int8_unit(std::string* which = nullptr) const;
};

// Measured on `threads` threads at once (0: all cores), once per process and thread count.
const Peaks& measured_peaks(int threads);

// Internal: the loops of the ISA translation units (peaks_avx512.cpp, peaks_avx2.cpp). Each runs `iters`
// iterations of 12 independent accumulators and returns a value derived from them (so nothing is elided);
// *ops_per_iter receives the multiply-add work of one iteration in flops (or int8 ops).
float peak_loop_dpbf16_zmm(long iters, float seed, double* ops_per_iter);
float peak_loop_fma_zmm(long iters, float seed, double* ops_per_iter);
float peak_loop_dpbusd_zmm(long iters, float seed, double* ops_per_iter);
float peak_loop_dpbusd_ymm_evex(long iters, float seed, double* ops_per_iter);  // AVX512-VNNI + VL
float peak_loop_fma_ymm(long iters, float seed, double* ops_per_iter);
float peak_loop_dpbusd_ymm_vex(long iters, float seed, double* ops_per_iter);   // AVX-VNNI

}  // namespace alpamayo::cpu
