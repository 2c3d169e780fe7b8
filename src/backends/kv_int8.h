// The int8 KV cache (BackendOptions::kv == "int8"). Every key and value row the expert attends to (the prompt
// cache and suffix rows, quantised once at bind, and the expert's own K and V rows, quantised each layer of each
// step) is rounded to int8 with one fp32 scale per row of d values:
//   a = max_c |x[c]|,  q[c] = round_half_even(x[c] * (127 / a)) in [-127, 127],  s = a / 127,  x^[c] = q[c] * s.
// A row of zeros has s = 0 and q = 0. The reference backend attends to x^ in fp32 (the oracle); the cpu backend
// stores q and s and multiplies int8 rows directly (docs/CPU_BACKEND.md). Both take q and s from here, so they
// see the same bits. fp-contract is off (CMakeLists.txt): x * inv and the rounding are separate IEEE operations
// whether or not the compiler vectorises this loop.
#pragma once
#include <cmath>
#include <cstdint>

namespace alpamayo {

// Quantises one row of n values into q; returns its scale s. A row holding a NaN or an infinity gets q = 0 and
// s = NaN, so that what reads it turns non-finite as it would have with the row itself (the sessions' non-finite
// checks then name the stage).
inline float quantize_row_s8(const float* x, int n, int8_t* q) {
  float a = 0.f;
  bool finite = true;
  for (int c = 0; c < n; ++c) {
    const float m = std::fabs(x[c]);
    finite &= m <= 3.4028234663852886e38f;  // false for NaN and infinities
    a = m > a ? m : a;
  }
  if (!finite || !(a > 0.f)) {
    for (int c = 0; c < n; ++c) q[c] = 0;
    return finite ? 0.f : NAN;
  }
  const float inv = 127.f / a;
  // 1.5 * 2^23: adding and subtracting it rounds |v| <= 127 to the nearest integer, ties to even (the default
  // rounding mode), like std::nearbyint but in a form every compiler vectorises.
  constexpr float kRound = 12582912.f;
  for (int c = 0; c < n; ++c) {
    const float v = x[c] * inv;
    const float r = (v + kRound) - kRound;
    q[c] = static_cast<int8_t>(r);
  }
  return a / 127.f;
}

// x^[c] = q[c] * s.
inline void dequantize_row_s8(const int8_t* q, float s, int n, float* x) {
  for (int c = 0; c < n; ++c) x[c] = static_cast<float>(q[c]) * s;
}

}  // namespace alpamayo
