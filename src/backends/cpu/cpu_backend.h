#pragma once
#include <memory>

#include "alpamayo/backend.h"

namespace alpamayo {
// The fast CPU backend (bf16 or int8 packed weights, oneDNN matmuls, AVX512-BF16 flash attention).
// Throws Error for an unknown opts.weights.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts);
}  // namespace alpamayo
