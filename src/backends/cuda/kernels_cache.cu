// Device-resident KV caches: the NaN/Inf scan of the valid rows (host caches are scanned by
// Context::validate; only a GPU backend can read device memory) and the conversion of F32/F16 caches to
// the bf16 the attention kernel reads.
#include <cuda_fp16.h>

#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::cuda {
namespace {

__device__ __forceinline__ bool non_finite(const void* p, CacheType t, size_t i) {
  if (t == CacheType::F32) return (static_cast<const uint32_t*>(p)[i] & 0x7f800000u) == 0x7f800000u;
  const uint16_t mask = t == CacheType::BF16 ? 0x7f80 : 0x7c00;
  return (static_cast<const uint16_t*>(p)[i] & mask) == mask;
}

__device__ __forceinline__ float load_f32(const void* p, CacheType t, size_t i) {
  if (t == CacheType::F32) return static_cast<const float*>(p)[i];
  if (t == CacheType::F16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// grid.y = B * H (one (sample, head) plane each), grid.x strides over the plane's valid elements.
__global__ void scan_k(const void* data, CacheType t, int H, int P, int d, const int* S, unsigned long long* first) {
  const int bh = blockIdx.y, b = bh / H;
  const size_t base = size_t(bh) * P * d, n = size_t(S[b]) * d;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (non_finite(data, t, base + i)) {
      atomicMin(first, static_cast<unsigned long long>(base + i));
      return;  // later elements of this thread have larger indices
    }
}

__global__ void convert_k(const void* src, CacheType t, int H, int P, int d, const int* S, uint16_t* dst) {
  const int bh = blockIdx.y, b = bh / H;
  const size_t base = size_t(bh) * P * d, n = size_t(S[b]) * d;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[base + i] = to_bf16_bits(load_f32(src, t, base + i));
}

dim3 plane_grid(int B, int H) { return dim3(64, B * H); }

}  // namespace

void scan_nonfinite(cudaStream_t s, const void* data, CacheType t, int B, int H, int P, int d, const int* S,
                    unsigned long long* first) {
  scan_k<<<plane_grid(B, H), 256, 0, s>>>(data, t, H, P, d, S, first);
  ALP_LAUNCHED("scan_nonfinite");
}

void convert_cache_bf16(cudaStream_t s, const void* src, CacheType t, int B, int H, int P, int d, const int* S,
                        uint16_t* dst) {
  convert_k<<<plane_grid(B, H), 256, 0, s>>>(src, t, H, P, d, S, dst);
  ALP_LAUNCHED("convert_cache_bf16");
}

// Loads this file's kernels now (lazy module loading would otherwise load them at first launch).
void preload_cache_kernels() {
  cudaFuncAttributes a;
  ALP_CUDA(cudaFuncGetAttributes(&a, scan_k));
  ALP_CUDA(cudaFuncGetAttributes(&a, convert_k));
}

}  // namespace alpamayo::cuda
