#include "model/sampler.h"

#include <cmath>

namespace alpamayo {

std::vector<float> rope_inv_freq(int d, double theta) {
  std::vector<float> inv(d / 2);
  const float base = static_cast<float>(theta);
  for (int j = 0; j < d / 2; ++j) inv[j] = 1.0f / std::pow(base, static_cast<float>(2 * j) / static_cast<float>(d));
  return inv;
}

RopeTables make_rope_tables(const std::vector<int64_t>& offset, const std::vector<int64_t>& rope_delta, int T,
                            int d, double theta) {
  RopeTables r;
  r.B = static_cast<int>(offset.size());
  r.T = T;
  r.d = d;
  r.cos.resize(int64_t(r.B) * T * d);
  r.sin.resize(r.cos.size());
  const std::vector<float> inv = rope_inv_freq(d, theta);
  const int half = d / 2;
  for (int b = 0; b < r.B; ++b)
    for (int i = 0; i < T; ++i) {
      const float p = static_cast<float>(i + rope_delta[b] + offset[b]);
      float* c = r.cos.data() + (int64_t(b) * T + i) * d;
      float* s = r.sin.data() + (int64_t(b) * T + i) * d;
      for (int j = 0; j < half; ++j) {
        const float a = p * inv[j];
        c[j] = c[j + half] = std::cos(a);
        s[j] = s[j + half] = std::sin(a);
      }
    }
  return r;
}

std::vector<float> euler_time_grid(int n) {
  const int steps = n + 1;
  std::vector<float> t(steps);
  if (steps == 1) { t[0] = 0.f; return t; }
  const float start = 0.f, end = 1.f, step = (end - start) / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  for (int i = 0; i < steps; ++i)
    t[i] = i < halfway ? start + step * static_cast<float>(i) : end - step * static_cast<float>(steps - i - 1);
  return t;
}

std::vector<float> gaussian_noise(uint64_t seed, int64_t n) {
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    out[i] = static_cast<float>(r * std::cos(a));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(a));
  }
  return out;
}

}  // namespace alpamayo
