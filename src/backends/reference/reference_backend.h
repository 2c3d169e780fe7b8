#pragma once
#include <functional>
#include <memory>

#include "alpamayo/backend.h"
#include "backends/weight_formats.h"

namespace alpamayo {
// The oracle: docs/MATH.md in plain fp32, weights read from the checkpoint's views one layer at a time.
std::unique_ptr<BackendModel> load_reference_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                                     const BackendOptions& opts);

// One expert layer of the reference, h [B*T, D] in place (the backend's step runs it for every layer; tools use it
// to measure one layer on a given input). kv: the bound cache, of which layer `layer` is read.
// probe (optional): called after each stage with its output ("q_proj", ..., "output after attention", ...,
// "output after the MLP"); returning false stops the layer there (the non-finite diagnosis, session.cpp).
// kv_int8: the int8 KV cache (BackendOptions::kv "int8", kv_int8.h): every key and value row the layer attends
// to (the sample's prompt rows, its suffix rows, its own K after q/k norm and rope, its own V) is replaced by
// its per-row quantisation x^ = q * s before the attention, which then runs in fp32 as usual.
using LayerProbe = std::function<bool(const char* stage, const float* out, int64_t n)>;
void reference_layer(const ExpertConfig& cfg, const LayerWeights& w, const WeightFormat& wf, const KVCache& kv,
                     int layer, const RopeTables& rope, int threads, float* h, const LayerProbe& probe = {},
                     bool kv_int8 = false);
// Its registry entry: formats, features, memory (reference_registry.cpp).
BackendInfo reference_backend_info();

}  // namespace alpamayo
