// Row kernels of one expert layer (device code; layer.cu launches them): residual add + RMSNorm, q/k RMSNorm
// + rotary, SiLU * up, fp8 row quantization. fp32 math; outputs rounded once to bf16 or e4m3 for the next matmul.
#pragma once
#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::ALP_CUDA_NS::kern {

// Writes w * (h * inv) for one row as `mode`; fp8 needs a pass for the row's max first.
__device__ __forceinline__ void write_normed_row(const float* hr, const float* w, float inv, int D, Act mode, void* out,
                                                 float* out_rs, int m, float* red) {
  if (mode == Act::F32) {
    float* o = static_cast<float*>(out) + size_t(m) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = w[i] * (hr[i] * inv);
  } else if (mode == Act::BF16) {
    uint16_t* o = static_cast<uint16_t*>(out) + size_t(m) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = to_bf16_bits(w[i] * (hr[i] * inv));
  } else {
    float amax = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) amax = fmaxf(amax, fabsf(w[i] * (hr[i] * inv)));
    const float scale = fp8_scale_of(block_max_abs(amax, red));
    uint8_t* o = static_cast<uint8_t*>(out) + size_t(m) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = to_e4m3(w[i] * (hr[i] * inv) / scale);
    if (threadIdx.x == 0) out_rs[m] = scale;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    residual_rmsnorm_k(float* h, MatOut y, const float* w, int D, float eps, Act mode, void* out, float* out_rs) {
  __shared__ float red[32];
  const int m = blockIdx.x;
  float* hr = h + size_t(m) * D;
  float ss = 0.f;
  if (y.y) {
    const float rs = mat_row_scale(y, m);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      const float v = hr[i] + mat_at(y, m, i, rs);
      hr[i] = v;
      ss += v * v;
    }
  } else {
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += hr[i] * hr[i];
  }
  ss = block_sum(ss, red);  // also orders every read of y.rs[m] before out_rs[m] is written
  const float inv = 1.0f / sqrtf(ss / D + eps);
  write_normed_row(hr, w, inv, D, mode, out, out_rs, m, red);
}

// One warp per (row, head): heads [0, Hq) are queries, [Hq, Hq+Hkv) keys, then values.
constexpr int kHeadWarps = 4;

__global__ void __launch_bounds__(kHeadWarps * 32)
    qk_norm_rope_k(MatOut qkv, const float* q_norm, const float* k_norm, const float* cos, const float* sin, int M,
                   int T, int Hq, int Hkv, int d, float eps, uint16_t* q, uint16_t* k, uint16_t* v) {
  ALP_DYNAMIC_SMEM(float, rows);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int heads = Hq + 2 * Hkv;
  const int unit = blockIdx.x * kHeadWarps + warp;
  if (unit >= M * heads) return;  // whole warps leave; only __syncwarp below
  const int m = unit / heads, hd = unit % heads;
  const int b = m / T, t = m % T;
  float* row = rows + warp * d;
  const float rs = mat_row_scale(qkv, m);
  for (int c = lane; c < d; c += 32) row[c] = mat_at(qkv, m, hd * d + c, rs);
  __syncwarp();
  if (hd >= Hq + Hkv) {
    uint16_t* dst = v + ((size_t(b) * Hkv + (hd - Hq - Hkv)) * T + t) * d;
    for (int c = lane; c < d; c += 32) dst[c] = to_bf16_bits(row[c]);
    return;
  }
  float ss = 0.f;
  for (int c = lane; c < d; c += 32) ss += row[c] * row[c];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / d + eps);
  const float* wn = hd < Hq ? q_norm : k_norm;
  for (int c = lane; c < d; c += 32) row[c] = wn[c] * (row[c] * inv);
  __syncwarp();
  const float* co = cos + size_t(m) * d;
  const float* si = sin + size_t(m) * d;
  const int half = d / 2;
  uint16_t* dst = hd < Hq ? q + ((size_t(b) * Hq + hd) * T + t) * d : k + ((size_t(b) * Hkv + (hd - Hq)) * T + t) * d;
  for (int c = lane; c < d; c += 32) {
    const float o = c < half ? row[c] * co[c] - row[c + half] * si[c] : row[c] * co[c] + row[c - half] * si[c];
    dst[c] = to_bf16_bits(o);
  }
}

__global__ void __launch_bounds__(kRowThreads) silu_mul_k(MatOut gu, int I, Act mode, void* out, float* out_rs) {
  __shared__ float red[32];
  const int m = blockIdx.x;
  const float rs = mat_row_scale(gu, m);  // read before out_rs (possibly the same buffer) is written
  auto value = [&](int i) { return silu(mat_at(gu, m, i, rs)) * mat_at(gu, m, I + i, rs); };
  if (mode == Act::BF16) {
    uint16_t* o = static_cast<uint16_t*>(out) + size_t(m) * I;
    for (int i = threadIdx.x; i < I; i += blockDim.x) o[i] = to_bf16_bits(value(i));
    return;
  }
  float amax = 0.f;
  for (int i = threadIdx.x; i < I; i += blockDim.x) amax = fmaxf(amax, fabsf(value(i)));
  const float scale = fp8_scale_of(block_max_abs(amax, red));
  uint8_t* o = static_cast<uint8_t*>(out) + size_t(m) * I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) o[i] = to_e4m3(value(i) / scale);
  if (threadIdx.x == 0) out_rs[m] = scale;
}

__global__ void __launch_bounds__(kRowThreads) quantize_rows_k(const float* x, int n, uint8_t* q, float* rs) {
  __shared__ float red[32];
  const int m = blockIdx.x;
  const float* xr = x + size_t(m) * n;
  float amax = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) amax = fmaxf(amax, fabsf(xr[i]));
  const float scale = fp8_scale_of(block_max_abs(amax, red));
  uint8_t* o = q + size_t(m) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = to_e4m3(xr[i] / scale);
  if (threadIdx.x == 0) rs[m] = scale;
}

}  // namespace alpamayo::ALP_CUDA_NS::kern
