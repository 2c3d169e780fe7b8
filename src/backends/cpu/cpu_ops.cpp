#include "backends/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>

#include "alpamayo/tensor.h"

namespace alpamayo::cpu {
namespace {

float inv_rms(const float* x, int n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / n + eps);
}

void quantize_row(const float* x, int n, int8_t* q, float* scale) {
  float mx = 0.f;
#pragma omp simd reduction(max : mx)
  for (int i = 0; i < n; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float s = mx > 0.f ? mx / 127.f : 1.f, inv = 1.f / s;
  *scale = s;
#pragma omp simd
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
}

}  // namespace

void rms_norm_rows(const float* x, const float* w, int r0, int r1, int n, float eps, float* tmp,
                   uint16_t* out_bf16, int8_t* out_s8, float* out_scale) {
  for (int r = r0; r < r1; ++r) {
    const float* xr = x + int64_t(r) * n;
    const float inv = inv_rms(xr, n, eps);
    if (out_bf16) {
      uint16_t* o = out_bf16 + int64_t(r) * n;
      for (int i = 0; i < n; ++i) o[i] = f32_to_bf16(w[i] * (xr[i] * inv));
    } else {
#pragma omp simd
      for (int i = 0; i < n; ++i) tmp[i] = w[i] * (xr[i] * inv);
      quantize_row(tmp, n, out_s8 + int64_t(r) * n, out_scale + r);
    }
  }
}

void quantize_rows(const float* x, int r0, int r1, int n, int8_t* q, float* scale) {
  for (int r = r0; r < r1; ++r) quantize_row(x + int64_t(r) * n, n, q + int64_t(r) * n, scale + r);
}

void add_rows(float* h, int ldh, const float* y, int ldy, int M, int n, const float* rs) {
  for (int r = 0; r < M; ++r) {
    float* hr = h + int64_t(r) * ldh;
    const float* yr = y + int64_t(r) * ldy;
    const float s = rs ? rs[r] : 1.f;
#pragma omp simd
    for (int c = 0; c < n; ++c) hr[c] += yr[c] * s;
  }
}

void silu_mul_rows(const float* y, int M, int n, const float* rs, int ldo, uint16_t* out_bf16, float* out_f32) {
  for (int r = 0; r < M; ++r) {
    const float* g = y + int64_t(r) * 2 * n;
    const float* u = g + n;
    const float s = rs ? rs[r] : 1.f;
    for (int c = 0; c < n; ++c) {
      const float gv = g[c] * s;
      const float v = gv / (1.0f + std::exp(-gv)) * (u[c] * s);
      if (out_bf16)
        out_bf16[int64_t(r) * ldo + c] = f32_to_bf16(v);
      else
        out_f32[int64_t(r) * ldo + c] = v;
    }
  }
}

void head_norm_rope(float* x, int d, const float* w, float eps, const float* cos, const float* sin, float* tmp) {
  const float inv = inv_rms(x, d, eps);
  for (int i = 0; i < d; ++i) tmp[i] = w[i] * (x[i] * inv);
  const int half = d / 2;
  for (int i = 0; i < half; ++i) x[i] = tmp[i] * cos[i] - tmp[i + half] * sin[i];
  for (int i = half; i < d; ++i) x[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
}

}  // namespace alpamayo::cpu
