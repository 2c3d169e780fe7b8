// The environment variables that tune a backend, read in one place: the programs' boundary (the CLI, the C API,
// the Python module) calls options_from_environment where it builds a model's BackendOptions; the engine and its
// backends read no environment themselves (docs/CUDA_BACKEND.md describes them).
#pragma once
#include <string>

#include "alpamayo/backend.h"

namespace alpamayo {

// Fills `o` from the environment, for a model of `backend` (empty: the default backend), where the caller left the
// option at its default:
//   ALPAMAYO_CUDA_GEMM=cublaslt|own   the cuda backend's weight matmuls: kernels "gemm=..." (cuda only)
//   ALPAMAYO_CUDA_GRAPHS=0            graphs = false
//   ALPAMAYO_CUBLASLT=PATH            cublaslt_path
// Throws Error for a value it does not know.
void options_from_environment(BackendOptions& o, const std::string& backend = "");

}  // namespace alpamayo
