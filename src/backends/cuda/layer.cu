// Launchers of the layer row kernels (layer.cuh).
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/layer.cuh"

namespace alpamayo::ALP_CUDA_NS {

using namespace kern;  // the kernels and their launch constants

void residual_rmsnorm(cudaStream_t s, float* h, const MatOut& y, const float* w, int M, int D, float eps, Act mode,
                      void* out, float* out_rs) {
  ALP_LAUNCH(kern::residual_rmsnorm_k, M, kern::kRowThreads, 0, s)(h, y, w, D, eps, mode, out, out_rs);
  ALP_LAUNCHED("residual_rmsnorm");
}

void qk_norm_rope(cudaStream_t s, const MatOut& qkv, const float* q_norm, const float* k_norm, const float* cos,
                  const float* sin, int B, int T, int Hq, int Hkv, int d, float eps, uint16_t* q, uint16_t* k,
                  uint16_t* v) {
  const int M = B * T, units = M * (Hq + 2 * Hkv);
  const int blocks = (units + kHeadWarps - 1) / kHeadWarps;
  ALP_LAUNCH(kern::qk_norm_rope_k, blocks, kHeadWarps * 32, kHeadWarps * d * sizeof(float), s)
  (qkv, q_norm, k_norm, cos, sin, M, T, Hq, Hkv, d, eps, q, k, v);
  ALP_LAUNCHED("qk_norm_rope");
}

void silu_mul(cudaStream_t s, const MatOut& gu, int M, int I, Act mode, void* out, float* out_rs) {
  ALP_LAUNCH(kern::silu_mul_k, M, kern::kRowThreads, 0, s)(gu, I, mode, out, out_rs);
  ALP_LAUNCHED("silu_mul");
}

void quantize_rows_fp8(cudaStream_t s, const float* x, int M, int n, uint8_t* q, float* rs) {
  ALP_LAUNCH(kern::quantize_rows_k, M, kern::kRowThreads, 0, s)(x, n, q, rs);
  ALP_LAUNCHED("quantize_rows_fp8");
}

void quantize_weight_fp8(cudaStream_t s, const float* w, int N, int K, uint8_t* q, float* scale) {
  ALP_LAUNCH(kern::quantize_rows_k, N, kern::kRowThreads, 0, s)(w, K, q, scale);
  ALP_LAUNCHED("quantize_weight_fp8");
}

// Loads this file's kernels now (lazy module loading would otherwise load them at first launch).
void preload_layer_kernels() {
  cudaFuncAttributes a;
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::residual_rmsnorm_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::qk_norm_rope_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::silu_mul_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::quantize_rows_k));
}

}  // namespace alpamayo::ALP_CUDA_NS
