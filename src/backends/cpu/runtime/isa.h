// What the CPU and the operating system let this process execute, detected once per process with CPUID
// and XGETBV (and, for AMX, Linux's permission request), optionally capped per model (BackendOptions::isa_cap,
// which the CLI, C API and Python module fill from ALPAMAYO_CPU_ISA: alpamayo/environment.h). Every
// ISA-specific kernel is compiled in its own translation unit with its own target flags and is called only
// after a check here (docs/CPU_BACKEND.md, "Kernels chosen at run time").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace alpamayo::cpu {

// Instruction-set features, as bits. Each holds only if the OS also saves the registers it needs.
enum IsaBit : uint32_t {
  kAvx2Fma = 1u << 0,     // AVX2 + FMA + F16C: the portable build's baseline
  kAvx512 = 1u << 1,      // AVX-512 F, BW, VL, DQ
  kAvx512Vnni = 1u << 2,  // AVX512-VNNI (vpdpbusd on zmm)
  kAvx512Bf16 = 1u << 3,  // AVX512-BF16 (vdpbf16ps)
  kAvxVnni = 1u << 4,     // AVX-VNNI (vpdpbusd on ymm)
  kAmxBf16 = 1u << 5,     // AMX tiles with bf16 (the OS granted the tile state)
  kAmxInt8 = 1u << 6,     // AMX tiles with int8
};

struct IsaInfo {
  uint32_t detected = 0;  // what CPUID/XGETBV/the OS expose
  uint32_t usable = 0;    // detected, within the cap
  std::string cap;        // the cap in force ("" when none)
  std::string cap_source = "ALPAMAYO_CPU_ISA";  // where the cap came from, for messages
  bool has(uint32_t bits) const { return (usable & bits) == bits; }
  // "avx2_fma avx512 avx512_vnni avx512_bf16" (usable), with the capped-away features in brackets.
  std::string describe() const;
};

// A cap on what the kernels may use (BackendOptions::isa_cap, the values of ALPAMAYO_CPU_ISA):
//   avx2        AVX2 + FMA: the portable baseline
//   avx2_vnni   AVX2 + FMA + AVX-VNNI
//   avx512      + AVX-512 F/BW/VL/DQ
//   avx512_vnni + AVX512-VNNI
//   avx512_bf16 + AVX512-BF16
//   amx / all   everything detected (the default)
// An unknown value is an error naming where it came from and the accepted values.
//
// isa(): detected once (thread-safe), within the process's ceiling (set_isa_ceiling; none unless a program sets
// one): what a kernel may run on at all, and what programs without a model (benchmarks) use.
const IsaInfo& isa();
// isa() capped further by `cap` ("" for none; `source` names it in messages): what one model's kernels may use.
IsaInfo isa_with_cap(const std::string& cap, const std::string& source = "isa_cap");
// oneDNN's instruction set is one per process (dnnl::set_max_cpu_isa, only before its first primitive): the
// ceiling's. Empty when it stays within i (a model's cap), else why not: oneDNN is then no candidate for that
// model, so that one model's cap never changes what another runs.
std::string onednn_within_cap(const IsaInfo& i);
// The process's ceiling, for a program that caps everything it runs (the test binary under ctest's
// conformance_avx2): isa() and every model stay within it, oneDNN too. Call before anything else of the backend.
void set_isa_ceiling(const std::string& cap, const std::string& source);

// What a model's kernel choices depend on besides the machine: the instruction sets it may use and the kernels it
// forces (BackendOptions::isa_cap and kernels, with where the latter came from).
struct KernelScope {
  IsaInfo isa;
  std::string kernels, source = "kernels";
};
// isa() and nothing forced: what programs without a model (benchmarks, tests of one kernel) choose under.
KernelScope process_kernel_scope();

// Names for messages and for ALPAMAYO_CPU_ISA; bits_from_name throws alpamayo::Error on unknown names.
std::string isa_names(uint32_t bits);
uint32_t isa_cap_from_name(const std::string& name);

// Kernel choice per op. The ops with several kernels are listed in kKernelOps; a model's `kernels` option
// (BackendOptions::kernels, filled from ALPAMAYO_CPU_KERNELS at the program's boundary when not given:
// "attention=avx2_fma,matmul_bf16=onednn") forces one. forced_kernel() returns the name spec forces for op
// ("" if none) and throws alpamayo::Error for a malformed spec or an op not in kKernelOps, naming `source` (where
// spec came from: "kernels" or "ALPAMAYO_CPU_KERNELS"); the op's selector must reject a name it does not know or
// cannot run here, naming the candidates. "attention" also forces the int8 cache's kernel unless
// "attention_kv_int8" is given.
inline constexpr const char* kKernelOps[] = {"attention", "attention_kv_int8", "matmul_bf16", "matmul_int8"};
std::string forced_kernel(const std::string& op, const std::string& spec, const std::string& source = "kernels");

// What was chosen, for inspect, --profile and the benchmarks: per op the kernel, why ("forced by ...",
// "fastest of ...", "only one"), the throughput it was measured at (GFLOP/s; 0 if not measured), the
// instruction doing its multiply-adds ("vdpbf16ps zmm", "vfmadd231ps ymm", ...; peaks.h measures its peak) and
// the accuracy check at the choice (kernel_check.h): each checked candidate's worst |d| / bound against the
// portable kernel, and those rejected, with their difference and bound ("" where only the portable kernel ran).
// The shape kernels are timed on when chosen (the seed's: head dim 128, 2 query heads per KV head, 64 action
// tokens, hidden size 1536), the same for every model so that the choice depends on the machine only.
inline constexpr int kRepHeadDim = 128, kRepGroup = 2, kRepTokens = 64, kRepModelDim = 1536;

struct KernelChoice {
  std::string op, kernel, why;
  double gflops = 0;
  std::string instruction;
  std::string unit = "GFLOP/s";  // of gflops: GOP/s for the int8 weights' matmul
  std::string check = "";       // "checked against portable_fma on 64 x 1536 x 1024, worst |d| / bound: ..."
};
// The choices one model made (CpuModel::kernel_choices(); inspect --kernels keeps its own): one per op.
using KernelChoices = std::vector<KernelChoice>;
void record_kernel_choice(KernelChoices& made, const KernelChoice& c);  // replaces an earlier choice for the same op
// One line for inspect, --profile and the benchmarks: "op kernel rate  instruction; why", the rate as "not timed"
// where the kernel was not timed (a forced or the only runnable matmul kernel).
std::string format_kernel_choice(const KernelChoice& c);
// The accuracy check's line beside it: "op  checked against ..." ("" where nothing was checked). A line of its own:
// the choice's line keeps its form ("...; why"), which scripts read.
std::string format_kernel_check(const KernelChoice& c);
// Kernel timings use the calling thread's own CPU time: other processes taking turns on a shared core do not
// count. Among candidates timed in a fixed order, a later one must be more than kChoiceMargin times faster to
// win, so that kernels within noise of each other never flip between processes (their results differ in
// rounding).
double thread_cpu_seconds();
inline constexpr double kChoiceMargin = 1.25;
// The `kernels` value (ALPAMAYO_CPU_KERNELS) that forces every choice in `made` ("op=kernel,...", in kKernelOps
// order; "" if none). A timed choice can differ between processes where two kernels are close (and does under
// sanitizers, which time their instrumentation); their results differ in rounding, so results that must match
// bitwise across processes pin the choices with this value.
std::string kernel_pin(const KernelChoices& made);

}  // namespace alpamayo::cpu
