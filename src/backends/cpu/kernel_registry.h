// One choice procedure for every op with several kernels (docs/CPU_BACKEND.md, "Kernels chosen at run time"). An
// op describes its kernels (KernelOp: per candidate its name, its instruction and whether it can run within the
// model's instruction sets, and why not) and how to measure them on its timing data (KernelBench); choose_kernel
// then takes the forced one (after the accuracy check) or checks, times and picks, the same way for every op, and
// caches the result per process, op, timing shape, instruction sets and forcing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/kernel_check.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

struct KernelCandidate {
  std::string name;
  std::string instruction;  // what does its multiply-adds ("vdpbf16ps zmm", ...; "" for oneDNN: peaks.h)
  std::string why_not;      // "" when it can run within the model's instruction sets
};

// An op's timing data, built only when a choice is not cached; it runs one candidate at a time.
class KernelBench {
 public:
  virtual ~KernelBench() = default;
  virtual std::string shape() const = 0;  // "64 x 1536 x 1024", for the choice's messages
  // Candidate `name` once on the data, compared with the yardstick's output (kernel_check.h); *fail: the failure
  // for messages, "" when it passes.
  virtual KernelAccuracy check(const std::string& name, std::string* fail) = 0;
  // Its rate on one thread (GFLOP/s, or GOP/s for int8 weights); `lone`: the only one timed (briefly).
  virtual double rate(const std::string& name, bool lone) = 0;
};

struct KernelOp {
  std::string op;                          // one of kKernelOps
  std::string fallback_op;                 // forces this op too unless op is forced itself ("" none)
  std::string yardstick;                   // the portable kernel: the check's reference, runs everywhere
  std::string unit = "GFLOP/s";            // of the rates
  std::vector<KernelCandidate> candidates;  // in order of preference (a later one must be kChoiceMargin faster)
  std::string cache_key;                   // what else the choice depends on (the timing shape)
  uint32_t isa_key = 0;                    // the instruction sets the candidates were judged under
  std::function<std::unique_ptr<KernelBench>()> bench;
  // Whether a forced or lone candidate is timed too, so that reports show its rate (attention), or not (the
  // matmuls: their timing takes longer).
  bool time_lone = false;
  std::string lone_why = "only one";  // why, for a lone runnable candidate besides the yardstick
  std::string none_why = "only one";  // why, where nothing but the yardstick runs
  // Throws the op's error for a forced name that is unknown or cannot run here (how_not: why not, or "unknown
  // kernel"); unset: "SOURCE: op=NAME cannot be used: ... Candidates: ..." naming where each runs.
  std::function<void(const std::string& name, const std::string& how_not, const std::string& source)> refuse;
};

// The kernel scope.kernels forces for op (or its fallback op), after the accuracy check (an alpamayo::Error where
// it cannot run or fails it); else the fastest of the runnable candidates that pass the check (the yardstick only
// where no other runs or passes). Thread-safe; cached per process.
KernelChoice choose_kernel(const KernelOp& op, const KernelScope& scope);

}  // namespace alpamayo::cpu
