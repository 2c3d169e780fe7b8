// Launchers of the action projection and Euler kernels (action.cuh).
#include "backends/cuda/action.cuh"
#include "backends/cuda/cuda_util.h"

namespace alpamayo::ALP_CUDA_NS {

using namespace kern;  // the kernels and their launch constants

void fourier_features(cudaStream_t s, const float* x, const float* times, int k, const float* freqs, int M, int A,
                      int F, float* out) {
  const int n = M * (A + 1) * F;
  ALP_LAUNCH(kern::fourier_k, (n + 255) / 256, 256, 0, s)(x, times, k, freqs, M, A, F, out);
  ALP_LAUNCHED("fourier_features");
}

void linear_f32(cudaStream_t s, const float* x, int M, int K, const float* W, const float* b, int N, bool silu,
                float* y) {
  const dim3 grid((N + kTile - 1) / kern::kTile, (M + kTile - 1) / kern::kTile), block(kern::kTile, kern::kTile);
  ALP_LAUNCH(kern::linear_f32_k, grid, block, 0, s)(x, M, K, W, b, N, silu, y);
  ALP_LAUNCHED("linear_f32");
}

void rms_norm_f32(cudaStream_t s, const float* x, const float* w, int M, int n, float eps, float* y) {
  ALP_LAUNCH(kern::rms_norm_k, M, kern::kRowThreads, 0, s)(x, w, n, eps, y);
  ALP_LAUNCHED("rms_norm_f32");
}

void layer_norm_f32(cudaStream_t s, const float* x, const float* w, const float* b, int M, int n, float eps, float* y) {
  ALP_LAUNCH(kern::layer_norm_k, M, kern::kRowThreads, 0, s)(x, w, b, n, eps, y);
  ALP_LAUNCHED("layer_norm_f32");
}

void out_proj_euler(cudaStream_t s, const float* hidden, const float* hidden_u, float wu, float wg, const float* W,
                    const float* b, int M, int D, int A, const float* times, int k, float* x, float* v_out,
                    float* x_out) {
  const int threads = M * A * 32;
  ALP_LAUNCH(kern::out_proj_euler_k, (threads + 255) / 256, 256, 0, s)
  (hidden, hidden_u, wu, wg, W, b, M, D, A, times, k, x, v_out, x_out);
  ALP_LAUNCHED("out_proj_euler");
}

// Loads this file's kernels now (lazy module loading would otherwise load them at first launch).
void preload_action_kernels() {
  cudaFuncAttributes a;
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::fourier_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::linear_f32_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::rms_norm_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::layer_norm_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::out_proj_euler_k));
}

}  // namespace alpamayo::ALP_CUDA_NS
