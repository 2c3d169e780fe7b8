#include "model/fourier.h"

#include <cmath>

#include "alpamayo/tensor.h"

namespace alpamayo {

std::vector<float> fourier_freqs(int n_fourier, double max_freq, bool round_bf16) {
  const int half = n_fourier / 2;
  const double end = std::log10(max_freq);
  std::vector<float> f(half);
  for (int j = 0; j < half; ++j) {
    const double e = half > 1 ? end * j / (half - 1) : 0.0;
    const float v = static_cast<float>(std::pow(10.0, e));
    f[j] = round_bf16 ? bf16_round(v) : v;
  }
  return f;
}

void fourier_features(float z, const std::vector<float>& freqs, float* out) {
  // Same operation order as the release: ((z * f) * 2) * pi, in fp32.
  const float two_pi_order_pi = static_cast<float>(M_PI), sqrt2 = static_cast<float>(std::sqrt(2.0));
  const size_t h = freqs.size();
  for (size_t j = 0; j < h; ++j) {
    const float arg = ((z * freqs[j]) * 2.0f) * two_pi_order_pi;
    out[j] = std::sin(arg) * sqrt2;
    out[h + j] = std::cos(arg) * sqrt2;
  }
}

}  // namespace alpamayo
