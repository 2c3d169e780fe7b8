// The environment variables the engine honours, read in one place: the programs and bindings (the CLI, the C API,
// the Python module) call options_from_environment at their boundary and pass the options down; nothing else
// under src/ reads the environment (docs/ARCHITECTURE.md, "Options, not the environment").
#pragma once
#include <string>

#include "alpamayo/backend.h"

namespace alpamayo {

// Fills what `o` leaves empty from the environment, one variable each:
//   ALPAMAYO_CPU_KERNELS -> o.kernels (o.kernels_source = "ALPAMAYO_CPU_KERNELS")
//   ALPAMAYO_CPU_ISA     -> o.isa_cap (o.isa_cap_source = "ALPAMAYO_CPU_ISA")
// An option already given wins over its variable. Values are checked where they are used (at model load).
void options_from_environment(BackendOptions& o);

// ALPAMAYO_MEMORY_LIMIT, read at each memory check (available_memory_bytes, limits.h): "" when unset.
std::string memory_limit_from_environment();

}  // namespace alpamayo
