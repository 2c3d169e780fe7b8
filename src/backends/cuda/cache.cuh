// Device-resident KV caches, dense, strided or paged (KVView) (device code; cache.cu launches it): the NaN/Inf
// scan of the valid rows (host caches are scanned by Context::validate; only a GPU backend can read device memory)
// and the conversion of F32/F16 (or unaligned bf16) caches to the dense bf16 the attention kernel reads.
#pragma once
#include <cuda_fp16.h>

#include "backends/cuda/kernels_common.cuh"

namespace alpamayo::ALP_CUDA_NS::kern {

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

// grid.y = B * H (one (sequence, head) plane each), grid.x strides over the elements of the plane's rows
// [lo, hi), read through the view's addressing; `first` and dst use the dense logical index.
__global__ void scan_k(KVView v, CacheType t, int H, int P, int d, const int* lo, const int* hi,
                       unsigned long long* first) {
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const size_t base = size_t(bh) * P * d + size_t(lo[b]) * d, n = size_t(hi[b] - lo[b]) * d;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t row = lo[b] + int64_t(i / d), col = int64_t(i % d);
    if (non_finite(v.base, t, size_t(kv_view_offset(v, b, h, row) + col))) {
      atomicMin(first, static_cast<unsigned long long>(base + i));
      return;  // later elements of this thread have larger indices
    }
  }
}

__global__ void convert_k(KVView v, CacheType t, int H, int P, int d, const int* lo, const int* hi, uint16_t* dst) {
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const size_t base = size_t(bh) * P * d + size_t(lo[b]) * d, n = size_t(hi[b] - lo[b]) * d;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t row = lo[b] + int64_t(i / d), col = int64_t(i % d);
    dst[base + i] = to_bf16_bits(load_f32(v.base, t, size_t(kv_view_offset(v, b, h, row) + col)));
  }
}

inline dim3 plane_grid(int B, int H) { return dim3(64, B * H); }

}  // namespace alpamayo::ALP_CUDA_NS::kern
