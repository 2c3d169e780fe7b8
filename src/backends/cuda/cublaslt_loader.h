// cuBLASLt is loaded on first use (dlopen), not linked: a build with the cuda backend then starts, and runs
// every other backend, on a machine without the CUDA toolkit, and a process that never uses the cuda backend
// does not pay for mapping and initialising the library (docs/CUDA_BACKEND.md, "cuBLASLt, loaded on first
// use"). cublaslt_loader.cpp defines the cuBLASLt functions the backend calls, each forwarding to the loaded
// library's. The test-only cuda_emu backend links a fake of this interface (tests/cuda_emu).
#pragma once
#include <string>

#include "backends/cuda/cuda_ns.h"

namespace alpamayo::ALP_CUDA_NS::lt {

// The library for `path` (BackendOptions::cublaslt_path): `path` when not empty (a path, or a file name the
// dynamic loader searches for), else libcublasLt.so.<major version of the headers built against>, looked up by
// the dynamic loader and then in the CUDA toolkit's library folder found at build time.
std::string library_name(const std::string& path);
// Loads cuBLASLt from library_name(path) unless one is loaded already (thread-safe). Returns "" once a library is
// loaded, else why not: the names tried and the dynamic loader's message. A process holds one cuBLASLt (each
// forwarding function resolves its symbol once), so after the first load an empty `path` takes the library
// loaded, and another path is an error. The forwarding functions load the default library if nothing did
// before, and return CUBLAS_STATUS_NOT_INITIALIZED while none is loaded; cublasLtGetStatusString returns the
// reason.
std::string load(const std::string& path);

}  // namespace alpamayo::ALP_CUDA_NS::lt
