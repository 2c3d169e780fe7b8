// The environment variables that tune a backend, read in one place: the programs' boundary (the CLI, the C API,
// the Python module, the benchmarks) calls options_from_environment where it builds a model's BackendOptions; the
// engine and its backends read no environment themselves (docs/ARCHITECTURE.md, "Options, not the environment").
#pragma once
#include <string>

#include "alpamayo/backend.h"

namespace alpamayo {

// Fills `o` from the environment, for a model of `backend` (empty: the default backend), where the caller left the
// option at its default:
//   the backend's BackendInfo::kernels_variable   kernels (kernels_source names the variable in messages):
//     ALPAMAYO_CPU_KERNELS=op=kernel,...         the cpu backend's kernels
//     ALPAMAYO_CUDA_GEMM=cublaslt|own            the cuda backend's weight matmuls, kernels "gemm=..."
//   ALPAMAYO_CUDA_GRAPHS=0                         graphs = false
//   ALPAMAYO_CUBLASLT=PATH                         cublaslt_path
//   ALPAMAYO_CPU_ISA=avx2|...|all                  isa_cap (isa_cap_source names the variable)
// Values are checked where they are used (at model load), with the variable named.
void options_from_environment(BackendOptions& o, const std::string& backend = "");

// ALPAMAYO_MEMORY_LIMIT ("" when unset), which the memory checks read (available_memory_bytes, limits.h).
std::string memory_limit_from_environment();

}  // namespace alpamayo
