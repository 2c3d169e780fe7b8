// Launchers of the attention kernels (attention.cuh) and the per-model kernel preparation.
#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_util.h"

namespace alpamayo::ALP_CUDA_NS {

void preload_layer_kernels();
void preload_action_kernels();
void preload_cache_kernels();
void preload_gemm_kernels();

void attention_partial(cudaStream_t s, const AttnParams& p) {
  const float scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(p.d));
  const dim3 grid(p.n_items, p.Hkv, p.tiles);
  ALP_LAUNCH(kern::attention_partial_k, grid, kern::kAttnThreads, kern::kAttnSmemBytes, s)(p, scale_log2);
  ALP_LAUNCHED("attention_partial");
}

void attention_merge(cudaStream_t s, const AttnParams& p, Act mode, void* out) {
  const int64_t threads = int64_t(p.B) * p.Hkv * p.R * 32;  // one warp per query row: past 2^31 at large B
  ALP_LAUNCH(kern::attention_merge_k, static_cast<unsigned>((threads + 255) / 256), 256, 0, s)(p, mode, out);
  ALP_LAUNCHED("attention_merge");
}

int prepare_kernels() {
  ALP_CUDA(cudaFuncSetAttribute(kern::attention_partial_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kern::kAttnSmemBytes)));
  cudaFuncAttributes attr;
  ALP_CUDA(cudaFuncGetAttributes(&attr, kern::attention_merge_k));
  preload_layer_kernels();
  preload_action_kernels();
  preload_cache_kernels();
  preload_gemm_kernels();
  int ctas = 0;
  ALP_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kern::attention_partial_k, kern::kAttnThreads,
                                                         kern::kAttnSmemBytes));
  return ctas > 0 ? ctas : 1;
}

}  // namespace alpamayo::ALP_CUDA_NS
