// Peak throughput of the instructions the kernels multiply with, measured on this machine in register-only
// loops (no memory traffic): the ceilings against which the benchmarks and --profile state each op's floor
// and achieved fraction. Each loop runs about 50 ms on every thread at once; results are cached per thread
// count for the process. An instruction the CPU (or ALPAMAYO_CPU_ISA) does not offer reads 0.
#pragma once
#include <string>
#include <vector>

#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

struct PeakEntry {
  std::string instruction;  // "vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm", "vpdpbusd zmm", "vpdpwssd zmm", "vpmaddwd ymm", ...
  std::string unit;         // "GFLOP/s" (a multiply-add is 2 flops) or "GOP/s" (int8)
  double rate = 0;          // all threads together; 0: not runnable here
  std::string why_not;      // when rate == 0
};

struct Peaks {
  int threads = 0;
  std::vector<PeakEntry> entries;
  // The rate of an instruction (as in KernelChoice::instruction); 0 if unknown or not runnable. "A + B": a kernel
  // doing half its work with each (avx512_vnni attention: scores on vpdpbusd, P.V on vpdpwssd), 2 / (1/A + 1/B).
  double of(const std::string& instruction) const;
  // The fastest of the fp32-capable units for bf16 operands: max(vdpbf16ps zmm, vfmadd231ps zmm, ymm).
  double best_bf16_unit(std::string* which = nullptr) const;
  // The fastest int8 unit: max(vpdpbusd zmm, ymm, vpmaddwd ymm).
  double best_int8_unit(std::string* which = nullptr) const;
};

// Measured on `threads` threads at once (0: all cores), once per process and thread count.
const Peaks& measured_peaks(int threads);
// Measures again and keeps, per instruction, the best of all measurements so far (the same object
// measured_peaks returns). For a benchmark's summary after its timed work: a neighbour's burst at the first
// measurement then cannot lower the floor it reports against. Not while other threads read the peaks.
const Peaks& remeasure_peaks(int threads);

// Internal: the loops of the ISA translation units (peaks_avx512.cpp, peaks_avx2.cpp). Each runs `iters`
// iterations of 12 independent accumulators and returns a value derived from them (so nothing is elided);
// *ops_per_iter receives the multiply-add work of one iteration in flops (or int8 ops).
float peak_loop_dpbf16_zmm(long iters, float seed, double* ops_per_iter);
float peak_loop_fma_zmm(long iters, float seed, double* ops_per_iter);
float peak_loop_dpbusd_zmm(long iters, float seed, double* ops_per_iter);
float peak_loop_dpwssd_zmm(long iters, float seed, double* ops_per_iter);  // int16 pairs (AVX512-VNNI)
float peak_loop_dpbusd_ymm_evex(long iters, float seed, double* ops_per_iter);  // AVX512-VNNI + VL
float peak_loop_fma_ymm(long iters, float seed, double* ops_per_iter);
float peak_loop_dpbusd_ymm_vex(long iters, float seed, double* ops_per_iter);   // AVX-VNNI
float peak_loop_maddwd_ymm(long iters, float seed, double* ops_per_iter);       // AVX2: vpmaddwd + vpaddd

}  // namespace alpamayo::cpu

namespace alpamayo::cpu {

// The floor of one denoising step: the weight matmuls and the attention at the measured peak of the
// instruction their chosen kernel multiplies with (`chosen`: the model's, CpuModel::kernel_choices()). Weight
// matmuls without a recorded instruction (oneDNN, the block kernels) are held to the fastest unit for their operands: bf16 ->
// max(vdpbf16ps, fp32 FMA), int8 -> the fastest of vpdpbusd and vpmaddwd.
struct OpFloor {
  std::string op, kernel, instruction;
  double gflop = 0;     // per step
  double peak = 0;      // GFLOP/s (GOP/s), all threads
  double floor_ms = 0;  // gflop / peak
  double actual_ms = 0; // measured, when known (0 otherwise)
};
struct StepWork {
  double matmul_gflop = 0;     // 2 * M * (weights of the layers' linears), all layers
  double attention_gflop = 0;  // 4 * T * Hq * d * (keys attended), all samples and layers
};
// Per step of B samples of T tokens; attended[b]: keys sample b attends to (prompt + suffix + own rows).
StepWork step_work(int L, int D, int Hq, int Hkv, int d, int I, int T, const std::vector<long long>& attended);
// weights: the weight format ("bf16", "int8", "bfp8_b", ...); kv_int8: an int8 KV cache (op "attention_kv_int8").
std::vector<OpFloor> step_floors(const StepWork& w, const KernelChoices& chosen, const std::string& weights,
                                 int threads, bool kv_int8 = false);
// A table (one line per op, then the total), each line starting with `indent`.
std::string format_floors(const std::vector<OpFloor>& f, int threads, const std::string& indent);

}  // namespace alpamayo::cpu
