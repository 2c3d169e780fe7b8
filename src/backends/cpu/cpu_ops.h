// Row-wise elementwise kernels of the cpu backend (norms, quantization, epilogues), fp32 math.
// Plain loops the compiler vectorizes; they move little data next to the matmuls and attention.
#pragma once
#include <cstdint>

namespace alpamayo::cpu {

// y = w * x / sqrt(mean(x^2) + eps) for rows [r0, r1) of width n, as bf16 (out_bf16) or as symmetric
// per-row int8 (out_u8 = q + 128 with out_scale[r], see quantize_rows); one output is non-null. tmp: n floats.
void rms_norm_rows(const float* x, const float* w, int r0, int r1, int n, float eps, float* tmp,
                   uint16_t* out_bf16, uint8_t* out_u8, float* out_scale);

// The same norm with fp32 output rows y [r0, r1) (the final norm).
void rms_norm_rows_f32(const float* x, const float* w, int r0, int r1, int n, float eps, float* y);

// Symmetric per-row int8: scale[r] = max|x| / 127, q = round(x / scale) in [-127, 127], stored q + 128.
void quantize_rows(const float* x, int r0, int r1, int n, uint8_t* q, float* scale);

// The int8 weights of every int8 path (oneDNN's and the cpu backend's own kernels multiply the same values): row n
// of W [N, K] gets scale[n] = max|w| / 127 (1 for a zero row) and q = round-to-nearest-even(w / scale) clamped to
// [-127, 127]; row_sum[n] = sum_k q (row_sum may be null).
void quantize_weight_rows(const float* W, int K, int N, int8_t* q, float* scale, int32_t* row_sum);

// Matmul epilogues. A raw output y' becomes (y'[r][c] - corr[c]) * cs[c] * rs[r]; corr, cs and rs are
// null for bf16; int8 passes the +128 correction, the weight scales and the activation row scales.
// h[r][c] += y over rows [0, M) and n columns; h has stride ldh, y stride ldy.
void add_rows(float* h, int ldh, const float* y, int ldy, int M, int n, const float* rs, const float* corr,
              const float* cs);
// out[r][c] = y[r][c] over rows [0, M) and n columns (out stride ldo, y stride n).
void copy_rows(float* out, int ldo, const float* y, int M, int n, const float* rs, const float* corr,
               const float* cs);
// out[r][c] = silu(g) * u with g = y[r][0..n), u = y[r][n..2n) (corr, cs have 2n entries).
void silu_mul_rows(const float* y, int M, int n, const float* rs, const float* corr, const float* cs, int ldo,
                   uint16_t* out_bf16, float* out_f32);

// bf16 stores of fp32 rows: contiguous, and as pairs (x[2i], x[2i+1]) at out[i * stride] (query layout).
void store_bf16(const float* x, int n, uint16_t* out);
void store_bf16_pairs(const float* x, int half, uint32_t* out, int64_t stride);

// In-place RMSNorm over d followed by HF rotate_half rotary with tables cos/sin [d]. tmp: d floats.
void head_norm_rope(float* x, int d, const float* w, float eps, const float* cos, const float* sin, float* tmp);

}  // namespace alpamayo::cpu
