// Launchers and split-K planning of the skinny weight matmul (skinny_gemm.cuh).
#include <algorithm>

#include "backends/cuda/cuda_util.h"
#include "backends/cuda/skinny_gemm.cuh"

namespace alpamayo::ALP_CUDA_NS {

int skinny_gemm_ctas_per_sm(bool fp8) {
  int n = 0;
  if (fp8)
    ALP_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern::skinny_gemm_k<true>, kern::kGemmThreads,
                                                           kern::GemmCfg<true>::kSmem));
  else
    ALP_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern::skinny_gemm_k<false>, kern::kGemmThreads,
                                                           kern::GemmCfg<false>::kSmem));
  return n > 0 ? n : 1;
}

SkinnyPlan plan_skinny_gemm(int N, int K, int M, int sm_count, bool fp8) {
  SkinnyPlan p;
  p.N = N;
  p.K = K;
  p.M = M;
  p.fp8 = fp8;
  const int tiles = ((N + kern::kCh - 1) / kern::kCh) * ((M + kern::kTok - 1) / kern::kTok);
  const int chunks = (K + kern::kKC - 1) / kern::kKC;
  const int slots = sm_count * skinny_gemm_ctas_per_sm(fp8);
  int splits = std::max(1, std::min(chunks, (slots + tiles - 1) / tiles));
  p.chunks_per_split = (chunks + splits - 1) / splits;
  p.splits = (chunks + p.chunks_per_split - 1) / p.chunks_per_split;
  return p;
}

void skinny_gemm(cudaStream_t s, const SkinnyPlan& p, const uint16_t* X, const void* W, float* Y, size_t split_stride) {
  const dim3 grid((p.N + kern::kCh - 1) / kern::kCh, (p.M + kern::kTok - 1) / kern::kTok, p.splits);
  const uint8_t* w = static_cast<const uint8_t*>(W);
  if (p.fp8)
    ALP_LAUNCH(kern::skinny_gemm_k<true>, grid, kern::kGemmThreads, kern::GemmCfg<true>::kSmem, s)
    (X, w, Y, p.M, p.N, p.K, p.chunks_per_split, split_stride);
  else
    ALP_LAUNCH(kern::skinny_gemm_k<false>, grid, kern::kGemmThreads, kern::GemmCfg<false>::kSmem, s)
    (X, w, Y, p.M, p.N, p.K, p.chunks_per_split, split_stride);
  ALP_LAUNCHED("skinny_gemm");
}

void preload_gemm_kernels() {
  ALP_CUDA(cudaFuncSetAttribute(kern::skinny_gemm_k<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kern::GemmCfg<true>::kSmem));
  ALP_CUDA(cudaFuncSetAttribute(kern::skinny_gemm_k<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kern::GemmCfg<false>::kSmem));
}

}  // namespace alpamayo::ALP_CUDA_NS
