// Row-wise elementwise kernels of the cpu backend (norms, quantization, epilogues), fp32 math.
// Plain loops the compiler vectorizes; they move little data next to the matmuls and attention.
#pragma once
#include <cstdint>

namespace alpamayo::cpu {

// y = w * x / sqrt(mean(x^2) + eps) for rows [r0, r1) of width n, as bf16 (out_bf16) or as symmetric
// per-row int8 (out_s8 with out_scale[r]); exactly one output is non-null. tmp: n floats.
void rms_norm_rows(const float* x, const float* w, int r0, int r1, int n, float eps, float* tmp,
                   uint16_t* out_bf16, int8_t* out_s8, float* out_scale);

// Symmetric per-row int8: scale[r] = max|x| / 127, q = round(x / scale).
void quantize_rows(const float* x, int r0, int r1, int n, int8_t* q, float* scale);

// h[r][c] += y[r][c] * rs[r] over rows [0, M) and n columns; h has stride ldh, y stride ldy; rs may be null.
void add_rows(float* h, int ldh, const float* y, int ldy, int M, int n, const float* rs);

// out[r][c] = silu(g[r][c] * s) * (u[r][c] * s), s = rs[r] or 1; g = y[r][0..n), u = y[r][n..2n).
void silu_mul_rows(const float* y, int M, int n, const float* rs, int ldo, uint16_t* out_bf16, float* out_f32);

// In-place RMSNorm over d followed by HF rotate_half rotary with tables cos/sin [d]. tmp: d floats.
void head_norm_rope(float* x, int d, const float* w, float eps, const float* cos, const float* sin, float* tmp);

}  // namespace alpamayo::cpu
