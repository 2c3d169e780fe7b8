#pragma once
#include <memory>

#include "alpamayo/backend.h"

namespace alpamayo {
// The fast CPU backend (bf16 or int8 packed weights, oneDNN matmuls, AVX512-BF16 flash attention).
std::unique_ptr<BackendModel> load_cpu_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                               const BackendOptions& opts);
// Its registry entry: formats, features, memory (cpu_registry.cpp).
BackendInfo cpu_backend_info();

}  // namespace alpamayo
