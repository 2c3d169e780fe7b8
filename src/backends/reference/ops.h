// Plain fp32 operators of the reference backend, written for clarity. They are the op-level oracle for
// every other backend's kernels, so they take explicit sizes and raw pointers.
#pragma once
#include <cstdint>
#include <vector>

namespace alpamayo::ref {

// y[M, N] = x[M, K] W[N, K]^T (PyTorch Linear without bias), fp32 accumulation. threads <= 1: serial.
void matmul_nt(const float* x, int M, int K, const float* W, int N, float* y, int threads = 1);

// Row-wise RMSNorm: y = w * x / sqrt(mean(x^2) + eps), rows of width n. y may alias x.
void rms_norm(const float* x, const float* w, int rows, int n, double eps, float* y);

// In-place HF rotate_half rotary embedding of x [T, H, d] with tables cos/sin [T, d].
void rope_apply(float* x, int T, int H, int d, const float* cos, const float* sin);

// A run of cache rows one sample attends to: rows [0, rows) of each KV head h at k + h * head_stride
// (row stride d), values likewise.
struct KeySegment {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t head_stride = 0;
  int rows = 0;
};

// Non-causal GQA attention of one sample over its cache segments in order, then its own T tokens.
//   q [T, Hq, d] (normed, roped); own k, v [T, Hkv, d] (k normed, roped). out [T, Hq, d]. Softmax in fp32.
void attention(const float* q, const float* k_own, const float* v_own, const std::vector<KeySegment>& cache,
               int T, int Hq, int Hkv, int d, float* out, int threads = 1);

// Non-causal GQA attention of one sample.
//   q [T, Hq, d] (normed, roped); own k, v [T, Hkv, d] (k normed, roped);
//   cache k, v [Hkv, P, d]; only rows [0, S) are attended. out [T, Hq, d]. Softmax in fp32.
void attention(const float* q, const float* k_own, const float* v_own, const float* k_cache,
               const float* v_cache, int T, int Hq, int Hkv, int d, int P, int S, float* out,
               int threads = 1);

// The int8 KV cache (kv_int8.h): replaces each of `rows` rows of d values by its per-row int8 quantisation
// x^ = q * s (quantize_row_s8, then dequantize_row_s8), in place. A row holding a non-finite value is left as
// it is (int8 has no NaN or Inf; the sample then fails as it would without int8).
void round_rows_s8(float* x, int64_t rows, int d);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

}  // namespace alpamayo::ref
