// Peak throughput of the instructions the kernels multiply with, measured on this machine in register-only
// loops (no memory traffic), AMX tiles included, and the streaming read bandwidth of memory: the roofline
// against which the benchmarks and --profile state each op's floor (max(flop / peak, bytes / bandwidth) per
// phase) and the fraction of it a step reaches. Each loop runs about 25 ms on every thread at once, three
// times; results are cached per thread count for the process. An instruction the CPU (or ALPAMAYO_CPU_ISA)
// does not offer reads 0.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

struct PeakEntry {
  std::string instruction;  // "tdpbf16ps tmm", "vdpbf16ps zmm", "vfmadd231ps zmm", "tdpbusd tmm", "vpdpbusd zmm", ...
  std::string unit;         // "GFLOP/s" (a multiply-add is 2 flops) or "GOP/s" (int8)
  double rate = 0;          // all threads together; 0: not runnable here
  std::string why_not;      // when rate == 0
  uint32_t need = 0;        // the IsaBits it executes on (0: none named)
};

struct Peaks {
  int threads = 0;
  std::vector<PeakEntry> entries;
  // Streaming read bandwidth of memory, GB/s, all threads reading their own contiguous part of a buffer several
  // times the last-level cache (read_bandwidth_gbs).
  double read_gbs = 0;
  // The rate of an instruction (as in KernelChoice::instruction); 0 if unknown or not runnable. "A + B": a kernel
  // doing half its work with each (avx512_vnni attention: scores on vpdpbusd, P.V on vpdpwssd), 2 / (1/A + 1/B).
  double of(const std::string& instruction) const;
  // The fastest unit for bf16 operands: max(tdpbf16ps tmm, vdpbf16ps zmm, vfmadd231ps zmm, ymm), of those within
  // `usable` (IsaBits: a model's capped set; the peaks are measured for the whole process).
  double best_bf16_unit(std::string* which = nullptr, uint32_t usable = ~0u) const;
  // The fastest int8 unit: max(tdpbusd tmm, vpdpbusd zmm, ymm, vpmaddwd ymm), within `usable`.
  double best_int8_unit(std::string* which = nullptr, uint32_t usable = ~0u) const;
};

// Measured on `threads` threads at once (0: all cores), once per process and thread count (about 1 s with the
// bandwidth).
const Peaks& measured_peaks(int threads);
// The streaming read bandwidth in GB/s on `threads` threads, each reading its own contiguous part of a buffer of
// max(1 GiB, 4 x the last-level cache) (at most 4 GiB), best of two passes after the first touch; 0 if the buffer
// cannot be had. Uncached: measured_peaks keeps it.
double read_bandwidth_gbs(int threads);
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
float peak_loop_amx_bf16(long iters, float seed, double* ops_per_iter);         // AMX: tdpbf16ps, 4 tiles
float peak_loop_amx_int8(long iters, float seed, double* ops_per_iter);         // AMX: tdpbusd, 4 tiles
// Reads `bytes` (a multiple of 256, 64-byte aligned) at p and returns a value derived from all of it.
uint64_t read_loop_avx512(const void* p, size_t bytes);

}  // namespace alpamayo::cpu

namespace alpamayo::cpu {

// The floor of one denoising step, per phase max(flop / peak, bytes / bandwidth) (the roofline), summed over the
// phases of an op: the weight matmuls (qkv, o_proj, gate_up, down) and the attention. The peak is that of the
// instruction the op's chosen kernel multiplies with (`chosen`: the model's, CpuModel::kernel_choices()); weight
// matmuls without a recorded instruction (oneDNN, the block kernels) are held to the fastest unit on the CPU for
// their operands (AMX included: oneDNN uses it where usable), and the table says so ("best: ..."). Bytes are
// those a step must move at least once: the weights, the cache rows attended and the matmuls' activations.
struct PhaseWork {
  std::string phase;  // "qkv", "o_proj", "gate_up", "down", "attention"
  double gflop = 0;   // per step (GOP for int8 weights), all layers
  double gbytes = 0;  // GB per step, all layers
};
struct StepWork {
  double matmul_gflop = 0;     // 2 * M * (weights of the layers' linears), all layers
  double attention_gflop = 0;  // 4 * T * Hq * d * (keys attended), all samples and layers
  double matmul_gbytes = 0;    // weights + the matmuls' input rows read and fp32 output rows written
  double matmul_weight_gbytes = 0;  // the weights alone
  double attention_gbytes = 0; // K and V of the cache rows attended (distinct rows: a shared prompt once)
  std::vector<PhaseWork> matmul_phases;  // qkv, o_proj, gate_up, down
};
struct OpFloor {
  std::string op, kernel, instruction;
  double gflop = 0;       // per step
  double peak = 0;        // GFLOP/s (GOP/s), all threads
  double floor_ms = 0;    // sum over the op's phases of max(compute, memory)
  double actual_ms = 0;   // measured, when known (0 otherwise)
  double gbytes = 0;      // per step
  double read_gbs = 0;    // the streaming read bandwidth, GB/s
  double compute_ms = 0;  // gflop / peak
  double memory_ms = 0;   // gbytes / read_gbs
  // "compute" or "memory": which of the two makes most of the floor.
  const char* bound() const { return memory_ms > compute_ms ? "memory" : "compute"; }
};
// Bytes per weight of a format: bf16 2, int8 1 (its per-channel scales left out), bfp8_b 1.0625, bfp4_b 0.5625
// (a shared exponent byte per 16 values); 2 for a format not listed.
double weight_bytes_per_param(const std::string& weights);
// Per step of B samples of T tokens; attended[b]: keys sample b attends to (prompt + suffix + own rows).
// cache_rows: distinct cache rows read per layer (a prompt shared by samples counted once); -1: the sum of
// attended. weights: the weight format; kv_int8: one byte per cached value instead of two.
StepWork step_work(int L, int D, int Hq, int Hkv, int d, int I, int T, const std::vector<long long>& attended,
                   const std::string& weights = "bf16", bool kv_int8 = false, long long cache_rows = -1);
// The floors at given peaks (a plain function of its inputs, for tests), and at this machine's measured ones.
// usable: the instruction sets a held-to-the-fastest-unit op may count (a model's IsaInfo::usable: under a cap
// such as ALPAMAYO_CPU_ISA=avx512_bf16 the roofline is that of the CPU without the capped-off units).
std::vector<OpFloor> step_floors(const StepWork& w, const KernelChoices& chosen, const std::string& weights,
                                 const Peaks& peaks, bool kv_int8 = false, uint32_t usable = ~0u);
std::vector<OpFloor> step_floors(const StepWork& w, const KernelChoices& chosen, const std::string& weights,
                                 int threads, bool kv_int8 = false, uint32_t usable = ~0u);
// A table (one line per op, then the total floor and the fraction of it the step reached), each line starting
// with `indent`.
std::string format_floors(const std::vector<OpFloor>& f, int threads, const std::string& indent);

}  // namespace alpamayo::cpu
