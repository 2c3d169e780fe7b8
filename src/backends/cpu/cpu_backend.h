#pragma once
#include <memory>

#include "alpamayo/backend.h"

namespace alpamayo {
// The cpu backend: weights packed once at load (bf16, int8 or a block format), each op's kernel chosen at load
// among those this CPU runs (timed, checked against the portable kernel, or forced: docs/CPU_BACKEND.md), the
// weight matmuls on oneDNN or our own kernels (matmul/), attention on our flash-attention kernels (attention/).
std::unique_ptr<BackendModel> load_cpu_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                               const BackendOptions& opts);
}  // namespace alpamayo
