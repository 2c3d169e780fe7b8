#include "backends/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "alpamayo/tensor.h"

namespace alpamayo::cpu {
namespace {

// Branch-free forms of the scalar helpers, so the loops below vectorize.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// e^x to ~2 ulp for x in [-87, 88] (clamped outside): 2^n * 2^f, |f| <= 1/2, degree-6 polynomial.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.f), 88.f);
  const float t = x * 1.4426950408889634f;
  const float n = std::nearbyint(t);
  const float f = t - n;
  float p = 1.5403530393381606e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.f;
  uint32_t u;
  std::memcpy(&u, &p, 4);
  u += static_cast<uint32_t>(static_cast<int32_t>(n)) << 23;
  std::memcpy(&p, &u, 4);
  return p;
}

float inv_rms(const float* x, int n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / n + eps);
}

void quantize_row(const float* x, int n, uint8_t* q, float* scale) {
  float mx = 0.f;
#pragma omp simd reduction(max : mx)
  for (int i = 0; i < n; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float s = mx > 0.f ? mx / 127.f : 1.f, inv = 1.f / s;
  *scale = s;
#pragma omp simd
  for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(x[i] * inv)) + 128);
}

}  // namespace

void rms_norm_rows(const float* x, const float* w, int r0, int r1, int n, float eps, float* tmp,
                   uint16_t* out_bf16, uint8_t* out_u8, float* out_scale) {
  for (int r = r0; r < r1; ++r) {
    const float* xr = x + int64_t(r) * n;
    const float inv = inv_rms(xr, n, eps);
    if (out_bf16) {
      uint16_t* o = out_bf16 + int64_t(r) * n;
#pragma omp simd
      for (int i = 0; i < n; ++i) o[i] = to_bf16(w[i] * (xr[i] * inv));
    } else {
#pragma omp simd
      for (int i = 0; i < n; ++i) tmp[i] = w[i] * (xr[i] * inv);
      quantize_row(tmp, n, out_u8 + int64_t(r) * n, out_scale + r);
    }
  }
}

void rms_norm_rows_f32(const float* x, const float* w, int r0, int r1, int n, float eps, float* y) {
  for (int r = r0; r < r1; ++r) {
    const float* xr = x + int64_t(r) * n;
    float* yr = y + int64_t(r) * n;
    const float inv = inv_rms(xr, n, eps);
#pragma omp simd
    for (int i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void quantize_rows(const float* x, int r0, int r1, int n, uint8_t* q, float* scale) {
  for (int r = r0; r < r1; ++r) quantize_row(x + int64_t(r) * n, n, q + int64_t(r) * n, scale + r);
}

void quantize_weight_rows(const float* W, int K, int N, int8_t* q, float* scale, int32_t* row_sum) {
  for (int n = 0; n < N; ++n) {
    const float* w = W + int64_t(n) * K;
    int8_t* qn = q + int64_t(n) * K;
    float mx = 0.f;
#pragma omp simd reduction(max : mx)
    for (int k = 0; k < K; ++k) mx = std::max(mx, std::fabs(w[k]));
    const float s = mx > 0.f ? mx / 127.f : 1.f;
    scale[n] = s;
    // Vectorised (nearbyint rounds as lrintf does in the default mode): the scalar loop took most of an int8
    // model's packing time.
    int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int k = 0; k < K; ++k) {
      const int v = static_cast<int>(std::nearbyint(std::clamp(w[k] / s, -127.f, 127.f)));
      qn[k] = static_cast<int8_t>(v);
      sum += v;
    }
    if (row_sum) row_sum[n] = sum;
  }
}

void add_rows(float* h, int ldh, const float* y, int ldy, int M, int n, const float* rs, const float* corr,
              const float* cs) {
  for (int r = 0; r < M; ++r) {
    float* hr = h + int64_t(r) * ldh;
    const float* yr = y + int64_t(r) * ldy;
    const float s = rs ? rs[r] : 1.f;
    if (corr) {
#pragma omp simd
      for (int c = 0; c < n; ++c) hr[c] += (yr[c] - corr[c]) * (cs[c] * s);
    } else {
#pragma omp simd
      for (int c = 0; c < n; ++c) hr[c] += yr[c] * s;
    }
  }
}

void copy_rows(float* out, int ldo, const float* y, int M, int n, const float* rs, const float* corr,
               const float* cs) {
  for (int r = 0; r < M; ++r) {
    float* o = out + int64_t(r) * ldo;
    const float* yr = y + int64_t(r) * n;
    const float s = rs ? rs[r] : 1.f;
    if (corr) {
#pragma omp simd
      for (int c = 0; c < n; ++c) o[c] = (yr[c] - corr[c]) * (cs[c] * s);
    } else {
      std::memcpy(o, yr, sizeof(float) * n);
    }
  }
}

void silu_mul_rows(const float* y, int M, int n, const float* rs, const float* corr, const float* cs, int ldo,
                   uint16_t* out_bf16, float* out_f32) {
  for (int r = 0; r < M; ++r) {
    const float* g = y + int64_t(r) * 2 * n;
    const float* u = g + n;
    const float s = rs ? rs[r] : 1.f;
    if (out_bf16) {  // bf16 path: no correction
      uint16_t* o = out_bf16 + int64_t(r) * ldo;
#pragma omp simd
      for (int c = 0; c < n; ++c) {
        const float gv = g[c] * s;
        o[c] = to_bf16(gv / (1.0f + exp_approx(-gv)) * (u[c] * s));
      }
    } else {
      float* o = out_f32 + int64_t(r) * ldo;
      if (corr) {
#pragma omp simd
        for (int c = 0; c < n; ++c) {
          const float gv = (g[c] - corr[c]) * (cs[c] * s);
          o[c] = gv / (1.0f + exp_approx(-gv)) * ((u[c] - corr[n + c]) * (cs[n + c] * s));
        }
      } else {
#pragma omp simd
        for (int c = 0; c < n; ++c) {
          const float gv = g[c] * s;
          o[c] = gv / (1.0f + exp_approx(-gv)) * (u[c] * s);
        }
      }
    }
  }
}

void store_bf16(const float* x, int n, uint16_t* out) {
#pragma omp simd
  for (int i = 0; i < n; ++i) out[i] = to_bf16(x[i]);
}

void store_bf16_pairs(const float* x, int half, uint32_t* out, int64_t stride) {
  for (int i = 0; i < half; ++i)
    out[i * stride] = uint32_t(to_bf16(x[2 * i])) | (uint32_t(to_bf16(x[2 * i + 1])) << 16);
}

void head_norm_rope(float* x, int d, const float* w, float eps, const float* cos, const float* sin, float* tmp) {
  const float inv = inv_rms(x, d, eps);
  for (int i = 0; i < d; ++i) tmp[i] = w[i] * (x[i] * inv);
  const int half = d / 2;
  for (int i = 0; i < half; ++i) x[i] = tmp[i] * cos[i] - tmp[i + half] * sin[i];
  for (int i = half; i < d; ++i) x[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
}

}  // namespace alpamayo::cpu
