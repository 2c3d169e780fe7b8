// Why a layer's output turned non-finite: the layer re-run from its (finite) input in fp32, op by op, until one
// output is non-finite. Used by Session::sample to explain a backend's NonFiniteError; any backend's failure is
// explained the same way, by the plain fp32 math of docs/MATH.md (the reference backend's layer).
#pragma once
#include <string>
#include <vector>

#include "alpamayo/backend.h"

namespace alpamayo {

// The first stage of `layer` ("q_proj", ..., "mlp.up_proj", ...) whose fp32 output is non-finite for input h
// [B*T, D] over the host-readable cache kv; "" when every stage stays finite (the backend's rounding overflowed
// where fp32 does not).
std::string first_non_finite_stage(const ExpertConfig& c, const LayerWeights& w, const KVCache& kv, int layer,
                                   const RopeTables& rope, std::vector<float> h);

}  // namespace alpamayo
