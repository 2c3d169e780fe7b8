// What the cuda_emu backend's fake cuBLASLt loader (fake_cublaslt_loader.cpp) was asked for.
#pragma once
#include <string>
#include <vector>

namespace alpamayo::cuda_emu {

// Every path lt::load was called with, in order (one per model loaded).
std::vector<std::string> fake_cublaslt_requests();

}  // namespace alpamayo::cuda_emu
