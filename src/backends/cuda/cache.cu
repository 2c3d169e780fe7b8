// Launchers of the KV cache kernels (cache.cuh).
#include "backends/cuda/cache.cuh"
#include "backends/cuda/cuda_util.h"

namespace alpamayo::ALP_CUDA_NS {

using namespace kern;  // the kernels and their launch constants

void scan_nonfinite(cudaStream_t s, const KVView& v, CacheType t, int B, int H, int P, int d, const int* lo,
                    const int* hi, unsigned long long* first) {
  ALP_LAUNCH(kern::scan_k, kern::plane_grid(B, H), 256, 0, s)(v, t, H, P, d, lo, hi, first);
  ALP_LAUNCHED("scan_nonfinite");
}

void convert_cache_bf16(cudaStream_t s, const KVView& v, CacheType t, int B, int H, int P, int d, const int* lo,
                        const int* hi, uint16_t* dst) {
  ALP_LAUNCH(kern::convert_k, kern::plane_grid(B, H), 256, 0, s)(v, t, H, P, d, lo, hi, dst);
  ALP_LAUNCHED("convert_cache_bf16");
}

// Loads this file's kernels now (lazy module loading would otherwise load them at first launch).
void preload_cache_kernels() {
  cudaFuncAttributes a;
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::scan_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, kern::convert_k));
}

}  // namespace alpamayo::ALP_CUDA_NS
