#include "backends/cpu/profile/profile_table.h"

#include <cstdio>
#include <vector>

#include "backends/cpu/profile/peaks.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

namespace {
// snprintf into a std::string (the table's lines are short; 512 bytes hold any of them).
template <class... Args>
std::string line(const char* fmt, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}
}  // namespace

std::string format_profile(const StepProfile& p) {
  std::string s = line("cpu backend profile (%s weights, %d threads, B=%d T=%d S_max=%lld, L=%d)\n",
                       p.weights.c_str(), p.threads, p.B, p.T, static_cast<long long>(p.s_max), p.L);
  s += line("  %-20s %12s %12s %7s %7s\n", "op", "ms/layer", "ms/step", "%", "idle");
  double sum = 0;
  for (const ProfilePhase& ph : p.phases) sum += ph.seconds;
  const int L = p.L > 0 ? p.L : 1;
  for (const ProfilePhase& ph : p.phases)
    s += line("  %-20s %12.3f %12.2f %6.1f%% %6.1f%%\n", ph.name.c_str(), 1e3 * ph.seconds / L, 1e3 * ph.seconds,
              sum > 0 ? 100.0 * ph.seconds / sum : 0.0, 100.0 * ph.idle);
  s += line("  %-20s %12.3f %12.2f %6.1f%%\n", "total (layers)", 1e3 * sum / L, 1e3 * sum, 100.0);
  s += line("  %-20s %12s %12.2f\n", "step (wall)", "", 1e3 * p.wall_seconds);
  s += "  isa: " + p.isa + "\n";
  for (const ProfileKernel& k : p.kernels) {
    const KernelChoice c{k.op, k.kernel, k.why, k.rate, k.instruction, k.unit, k.check};
    s += "  kernel " + format_kernel_choice(c) + "\n";
    if (!c.check.empty()) s += "  check  " + format_kernel_check(c) + "\n";
  }
  s += "  pin these: ALPAMAYO_CPU_KERNELS=" + p.kernel_pin + "\n";
  std::vector<OpFloor> floors;
  for (const ProfileOp& o : p.ops)
    floors.push_back({o.op, o.kernel, o.instruction, o.gflop, o.peak, o.floor_ms, o.actual_ms, o.gbytes, o.read_gbs,
                      o.compute_ms, o.memory_ms});
  return s + format_floors(floors, p.peak_threads, "  ");
}

}  // namespace alpamayo::cpu
