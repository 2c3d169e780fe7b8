// action_in_proj (Fourier features, the MLP trunk, LayerNorm), action_out_proj and the Euler update (device
// code; action.cu launches them), in fp32 with the host's operation order where it decides rounding
// (docs/MATH.md sections 3-5).
#pragma once
#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::ALP_CUDA_NS::kern {

// One thread per feature: out[m][i*F + j], i <= A (A action dims, then time), j < F.
__global__ void fourier_k(const float* x, const float* times, int k, const float* freqs, int M, int A, int F,
                          float* out) {
  const int width = (A + 1) * F;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= M * width) return;
  const int m = idx / width, f = idx % width, i = f / F, j = f % F, half = F / 2;
  const float z = i < A ? x[m * A + i] : times[k];
  const float fr = freqs[i * half + (j % half)];
  // The release's order: ((z * f) * 2) * pi, then sin/cos times sqrt(2); explicit roundings, no FMA.
  const float arg = __fmul_rn(__fmul_rn(__fmul_rn(z, fr), 2.0f), 3.14159265358979323846f);
  const float sq2 = 1.41421356237309504880f;
  out[idx] = __fmul_rn(j < half ? sinf(arg) : cosf(arg), sq2);
}

constexpr int kTile = 16;

__global__ void linear_f32_k(const float* x, int M, int K, const float* W, const float* b, int N, bool act, float* y) {
  __shared__ float xs[kTile][kTile + 1], ws[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m = blockIdx.y * kTile + ty, n = blockIdx.x * kTile + tx, wn = blockIdx.x * kTile + ty;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    xs[ty][tx] = m < M && k0 + tx < K ? x[size_t(m) * K + k0 + tx] : 0.f;
    ws[ty][tx] = wn < N && k0 + tx < K ? W[size_t(wn) * K + k0 + tx] : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += xs[ty][kk] * ws[tx][kk];
    __syncthreads();
  }
  if (m < M && n < N) {
    const float v = acc + b[n];
    y[size_t(m) * N + n] = act ? silu(v) : v;
  }
}

__global__ void __launch_bounds__(kRowThreads) rms_norm_k(const float* x, const float* w, int n, float eps, float* y) {
  __shared__ float red[32];
  const float* xr = x + size_t(blockIdx.x) * n;
  float* yr = y + size_t(blockIdx.x) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

__global__ void __launch_bounds__(kRowThreads)
    layer_norm_k(const float* x, const float* w, const float* b, int n, float eps, float* y) {
  __shared__ float red[32];
  const float* xr = x + size_t(blockIdx.x) * n;
  float* yr = y + size_t(blockIdx.x) * n;
  float sum = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i];
  const float mean = block_sum(sum, red) / n;
  float sq = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sq += (xr[i] - mean) * (xr[i] - mean);
  const float inv = 1.0f / sqrtf(block_sum(sq, red) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// One warp per (row, action dim).
__global__ void out_proj_euler_k(const float* hidden, const float* hidden_u, float wu, float wg, const float* W,
                                 const float* b, int M, int D, int A, const float* times, int k, float* x, float* v_out,
                                 float* x_out) {
  const int unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (unit >= M * A) return;
  const int m = unit / A, a = unit % A;
  const float* wr = W + size_t(a) * D;
  auto project = [&](const float* h) {
    const float* hr = h + size_t(m) * D;
    float acc = 0.f;
    for (int i = lane; i < D; i += 32) acc += hr[i] * wr[i];
    return warp_sum(acc);
  };
  const float acc = project(hidden);
  const float acc_u = hidden_u ? project(hidden_u) : 0.f;
  if (lane == 0) {
    float v = acc + b[a];
    if (hidden_u) v = __fadd_rn(__fmul_rn(wu, acc_u + b[a]), __fmul_rn(wg, v));  // FlowMatching._guided_v
    const float dt = __fsub_rn(times[k + 1], times[k]);
    const float xn = __fadd_rn(x[unit], __fmul_rn(dt, v));
    x[unit] = xn;
    v_out[unit] = v;
    x_out[unit] = xn;
  }
}

}  // namespace alpamayo::ALP_CUDA_NS::kern
