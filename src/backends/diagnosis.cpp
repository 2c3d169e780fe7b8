#include "backends/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "backends/reference/reference_backend.h"
#include "backends/weight_formats.h"

namespace alpamayo {

std::string first_non_finite_stage(const ExpertConfig& c, const LayerWeights& w, const KVCache& kv, int layer,
                                   const RopeTables& rope, std::vector<float> h) {
  std::string found;
  BackendOptions f32;
  f32.weights = "f32";
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  reference_layer(c, w, parse_weight_format(f32), kv, layer, rope, threads, h.data(),
                  [&](const char* stage, const float* p, int64_t n) {
                    for (int64_t i = 0; i < n; ++i)
                      if (!std::isfinite(p[i])) {
                        found = stage;
                        return false;
                      }
                    return true;
                  });
  return found;
}

}  // namespace alpamayo
