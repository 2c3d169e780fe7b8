#pragma once
#include <memory>

#include "alpamayo/backend.h"

namespace alpamayo {
// The oracle: docs/MATH.md in plain fp32, weights read from the checkpoint's views one layer at a time.
std::unique_ptr<BackendModel> load_reference_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                                     const BackendOptions& opts);
}  // namespace alpamayo
