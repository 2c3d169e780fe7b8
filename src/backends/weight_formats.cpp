#include "backends/weight_formats.h"

#include <algorithm>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"

namespace alpamayo {

const char* linear_kind_name(LinearKind k) {
  static const char* names[kLinearKinds] = {"qkv", "o", "gate", "up", "down"};
  return names[static_cast<int>(k)];
}

WeightFormat parse_weight_format(const BackendOptions& opts) {
  WeightFormat wf;
  wf.name = opts.weights;
  bfp::Format f;
  if (bfp::parse_format(opts.weights, &f)) wf.block = f;
  check(opts.bf16_weights.empty() || wf.block,
        "bf16 weights (" + std::to_string(opts.bf16_weights.size()) +
            " given) apply to the block formats bfp8_b and bfp4_b only, not to weight format '" + opts.weights + "'");
  for (const std::string& n : opts.bf16_weights) {
    int k = 0;
    while (k < kLinearKinds && n != linear_kind_name(static_cast<LinearKind>(k))) ++k;
    check(k < kLinearKinds, "bf16 weights: unknown matrix '" + n + "' (expected qkv, o, gate, up or down)");
    wf.bf16[k] = true;
  }
  return wf;
}

void quantize_linear_transposed(bfp::Format f, float* W, int64_t N, int64_t K) {
  // 16 rows x 16 columns at a time: transpose, quantise each column as one block, transpose back.
  constexpr int B = bfp::kBlockSize;
  alignas(64) float t[B][B];
  for (int64_t n0 = 0; n0 < N; n0 += B) {
    const int nr = static_cast<int>(std::min<int64_t>(B, N - n0));
    for (int64_t k0 = 0; k0 < K; k0 += B) {
      const int kc = static_cast<int>(std::min<int64_t>(B, K - k0));
      for (int r = 0; r < nr; ++r)
        for (int c = 0; c < kc; ++c) t[c][r] = W[(n0 + r) * K + k0 + c];
      for (int c = 0; c < kc; ++c) bfp::quantize_block(f, t[c], t[c], nr);
      for (int r = 0; r < nr; ++r)
        for (int c = 0; c < kc; ++c) W[(n0 + r) * K + k0 + c] = t[c][r];
    }
  }
}

void apply_weight_format(const WeightFormat& wf, LinearKind k, float* W, int64_t N, int64_t K) {
  if (!wf.is_block()) return;
  if (const auto f = wf.block_of(k)) {
    quantize_linear_transposed(*f, W, N, K);
  } else {
    for (int64_t i = 0; i < N * K; ++i) W[i] = bf16_round(W[i]);
  }
}

}  // namespace alpamayo
