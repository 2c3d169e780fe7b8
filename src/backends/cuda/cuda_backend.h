// The cuda backend (docs/CUDA_BACKEND.md): weights uploaded once (bf16, or fp8 e4m3 with per-output-channel
// scales), the whole denoising loop on one NVIDIA GPU, captured once per bind as one CUDA graph.
// This header is plain C++: the registry includes it without the CUDA toolkit's headers.
#pragma once
#include <memory>
#include <string>

#include "alpamayo/backend.h"

namespace alpamayo {

std::unique_ptr<BackendModel> load_cuda_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                                const BackendOptions& opts);

// Why the cuda backend cannot run on this machine (no driver, no device, a device older than sm_89), or
// empty when it can. Probed once per process.
std::string cuda_unavailable();

// Its registry entry: formats, features, memory (cuda_registry.cpp).
BackendInfo cuda_backend_info();

}  // namespace alpamayo
