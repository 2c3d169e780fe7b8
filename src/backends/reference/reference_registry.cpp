// The reference backend's registry entry (src/backends/registry.cpp lists it).
#include "alpamayo/limits.h"
#include "backends/reference/reference_backend.h"

namespace alpamayo {

BackendInfo reference_backend_info() {
  BackendInfo b;
  b.name = "reference";
  b.weight_formats = {"f32", "bfp8_b", "bfp4_b"};
  b.kv_formats = {"f32", "int8"};
  b.load = load_reference_backend;
  b.features.shared_prompts = b.features.suffix_rows = b.features.left_padding = b.features.guidance = true;
  b.features.traces_non_finite = b.features.host_threads = true;
  b.features.strided_cache = b.features.paged_cache = true;
  // Weights stay in the checkpoint's mapping; a session converts one layer's weights and caches to f32 when the
  // layer runs.
  b.memory.session = [](MemoryEstimate& e, const ExpertConfig& c, const KVCache& kv, const KVCache* unguided) {
    auto layer_values = [](const KVCache& k) {  // key + value values of one layer, prompt and suffix caches
      return 2.0 * k.Hkv * k.d * (double(k.G) * k.P + double(k.B) * k.Q);
    };
    const double v = layer_values(kv) + (unguided ? layer_values(*unguided) : 0.0);
    e.add("one layer's weights and caches in f32", 4.0 * (layer_matrix_params(c) + v));
  };
  return b;
}

}  // namespace alpamayo
