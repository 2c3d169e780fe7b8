// The cpu backend's --profile table of one step (StepProfile, alpamayo/backend.h), as text: the phases of a
// layer with their time, share and idle share, the step's wall time, the kernels chosen and why, the
// ALPAMAYO_CPU_KERNELS value pinning them, and the step's floor at the measured peaks. The engine only
// records the profile; the CLI and bench_step print this.
#pragma once
#include <string>

#include "alpamayo/backend.h"

namespace alpamayo::cpu {

// The table, one line per row, each ending in '\n'.
std::string format_profile(const StepProfile& p);

}  // namespace alpamayo::cpu
