// cuBLASLt is loaded on first use (dlopen), not linked: a build with the cuda backend then starts, and runs
// every other backend, on a machine without the CUDA toolkit, and a process that never uses the cuda backend
// does not pay for mapping and initialising the library (docs/CUDA_BACKEND.md, "cuBLASLt, loaded on first
// use"). cublaslt_loader.cpp defines the cuBLASLt functions the backend calls, each forwarding to the loaded
// library's.
#pragma once
#include <string>

namespace alpamayo::cuda_lt {

// The library this process loads: ALPAMAYO_CUBLASLT when set (a path, or a file name the dynamic loader
// searches for), else libcublasLt.so.<major version of the headers built against>, looked up by the dynamic
// loader and then in the CUDA toolkit's library folder found at build time.
std::string library_name();
// "" once the library is loaded (the first call loads it; thread-safe), else why not: the names tried and the
// dynamic loader's message. The forwarding functions return CUBLAS_STATUS_NOT_INITIALIZED while it is not
// loaded, and cublasLtGetStatusString returns this message.
const std::string& unavailable();

}  // namespace alpamayo::cuda_lt
