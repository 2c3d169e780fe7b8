// The error model behind the conformance suite's bounds (docs/ACCURACY.md, "The error model"); the Python suite's
// tests/python/error_model.py is the same model. Nothing here is fitted to a measurement.
//
// A backend differs from its oracle (the reference backend: the same math in fp32, with the same weights where the
// reference offers the format) only by roundings at fixed sites of each residual unit (an expert layer; the
// action_in_proj and the output head count as one unit each). A rounding adds an error of relative RMS eps to the
// tensor it rounds; linear maps, RMSNorm and residual adds carry it at the same relative size. Within a unit the
// sites' roundings are independent (quadrature); from unit to unit the residual stream carries them and they may
// align (linear in the depth):
//   rho(depth) = depth * (sqrt(sum_sites eps^2) + sum_reductions 4 sqrt(K) u32)
// the last term being fp32 accumulation in any order a correct kernel may use (4 standard deviations of a random
// walk of partial sums no larger than the result). For a compared tensor r and the error e:
//   rms(e) <= rho rms(r)  ->  PCC >= sqrt(1 - (rho rms(r) / std(r))^2);   max|e| <= z(N) rho rms(r)
// with z(N) = sqrt(2 ln(2N / 1e-6)): a sum of many small roundings is near-Gaussian, its largest of N elements
// passes z(N) standard deviations with probability below 1e-6.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "alpamayo/bfp.h"
#include "alpamayo/tensor.h"

namespace alpamayo::conformance {

inline constexpr double kU32 = 0x1p-24;
inline constexpr double kUBf16 = 0x1p-8;          // bf16 round-to-nearest: |x^ - x| <= 2^-8 |x|
inline const double kEpsBf16 = kUBf16 / std::sqrt(3.0);  // its RMS: uniform over +-half an ulp, ulp <= 2^-7 |x|
inline constexpr double kKappaAct = 8.0;          // crest factor assumed for activation rows rounded to int8
inline constexpr double kLambda = 4.0;            // standard deviations of the accumulation-order term

// Symmetric int8 per row (step max|row| / 127): error uniform over +-step/2, RMS relative to the row's RMS
// kappa / (127 sqrt 12).
inline double eps_int8(double kappa) { return kappa / (127.0 * std::sqrt(12.0)); }

inline double z_factor(size_t n) { return std::sqrt(2.0 * std::log(2.0 * double(std::max<size_t>(n, 1)) / 1e-6)); }

// The model of one compared run: per-unit rho, from the rounding sites and the reductions.
struct ErrorModel {
  double rounding = 0, accumulation = 0;
  double per_unit() const { return rounding + accumulation; }
  double rho(int depth) const { return depth * per_unit(); }
};

// sites: each site's eps; K: the reduction lengths of one unit (D, Hq d, I, d, and the keys attended).
inline ErrorModel error_model(const std::vector<double>& sites, const std::vector<int64_t>& K) {
  ErrorModel m;
  double s2 = 0;
  for (double e : sites) s2 += e * e;
  m.rounding = std::sqrt(s2);
  for (int64_t k : K) m.accumulation += kLambda * std::sqrt(double(k)) * kU32;
  return m;
}

// The relative RMS error a weight format puts on these weights [out, in] (fp32 values), computed by rounding them
// as the format does: bf16 (RNE), int8 (symmetric per output row, step max|row| / 127, RNE), fp8 e4m3 (per output
// row scale max|row| / 448, 3 mantissa bits, RNE; subnormals below 2^-6 of the scale), bfp8_b / bfp4_b (blocks of
// 16 output features of one input column, the shared exponent of the largest, bfp.h's own rounding).
inline double weight_format_error(const std::string& format, const std::vector<float>& w, int out, int in) {
  std::vector<float> q(w.size());
  if (format == "bf16") {
    for (size_t i = 0; i < w.size(); ++i) q[i] = bf16_to_f32(f32_to_bf16(w[i]));
  } else if (format == "int8" || format == "fp8") {
    for (int r = 0; r < out; ++r) {
      float a = 0;
      for (int c = 0; c < in; ++c) a = std::max(a, std::fabs(w[size_t(r) * in + c]));
      for (int c = 0; c < in; ++c) {
        const size_t i = size_t(r) * in + c;
        if (a == 0) {
          q[i] = 0;
        } else if (format == "int8") {
          q[i] = std::nearbyint(w[i] * (127.f / a)) * (a / 127.f);
        } else {
          const double s = a / 448.0, v = w[i] / s;
          const double e = std::max(std::floor(std::log2(std::fabs(v) + 1e-300)), -6.0);  // e4m3: min normal 2^-6
          const double step = std::ldexp(1.0, int(e) - 3);
          q[i] = float(std::nearbyint(v / step) * step * s);
        }
      }
    }
  } else if (format == "bfp8_b" || format == "bfp4_b") {
    bfp::Format f;
    bfp::parse_format(format, &f);
    float blk[bfp::kBlockSize];
    for (int c = 0; c < in; ++c)
      for (int r0 = 0; r0 < out; r0 += bfp::kBlockSize) {
        const int n = std::min(bfp::kBlockSize, out - r0);
        for (int j = 0; j < bfp::kBlockSize; ++j) blk[j] = j < n ? w[size_t(r0 + j) * in + c] : 0.f;
        const uint8_t e = bfp::shared_exponent(blk);
        for (int j = 0; j < n; ++j) q[size_t(r0 + j) * in + c] = bfp::decode(bfp::encode(blk[j], e, f), e, f);
      }
  } else {
    return 0.0;  // f32: exact
  }
  double se = 0, sw = 0;
  for (size_t i = 0; i < w.size(); ++i) se += double(q[i] - w[i]) * (q[i] - w[i]), sw += double(w[i]) * w[i];
  return sw > 0 ? std::sqrt(se / sw) : 0.0;
}

}  // namespace alpamayo::conformance
