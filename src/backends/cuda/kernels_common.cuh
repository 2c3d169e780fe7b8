// Device helpers shared by the cuda backend's kernels: warp and block reductions (fixed order, so results
// are bitwise reproducible), bf16 / fp8 conversions and matmul-output reads. The tensor-core and
// asynchronous-copy primitives (inline PTX) are in device_api.h.
//
// The kernels live in *.cuh files in namespace alpamayo::ALP_CUDA_NS::kern, included by the .cu files that launch
// them. What they need from the CUDA toolchain comes through device_api.h, which the test-only cuda_emu backend
// (tests/cuda_emu) replaces: the same source then runs on the host in a SIMT emulator, which is how the tests
// check the kernels without a GPU.
#pragma once
#include <cstdint>

#include "backends/cuda/device_api.h"
#include "backends/cuda/kernels.h"

namespace alpamayo::ALP_CUDA_NS::kern {

// The element offset of row i of head h of sequence n in v (kernels.h, KVView).
__device__ __forceinline__ int64_t kv_view_offset(const KVView& v, int n, int h, int64_t i) {
  if (!v.pages) return n * v.seq + h * v.head + i * v.row;
  const int64_t page = v.pages[int64_t(n) * v.width + (i >> v.page_shift)];
  return page * v.seq + h * v.head + (i & ((int64_t(1) << v.page_shift) - 1)) * v.row;
}

// Threads of the one-block-per-row kernels (device_api.h; the SIMT emulator runs them with fewer).
constexpr int kRowThreads = ALP_ROW_THREADS;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block; every thread gets the result. `red` holds 32 floats of shared memory.
// blockDim.x must be a multiple of 32.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // red may still be read by an earlier reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : 0.f;
  r = kMax ? warp_max(r) : warp_sum(r);
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* red) { return block_reduce<false>(v, red); }
// For magnitudes (v >= 0): the identity of the reduction is 0.
__device__ __forceinline__ float block_max_abs(float v, float* red) { return block_reduce<true>(v, red); }

__device__ __forceinline__ uint16_t to_bf16_bits(float f) {
  const __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<const uint16_t*>(&h);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint8_t to_e4m3(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float fp8_scale_of(float amax) { return amax > 0.f ? amax / kFp8Max : 1.f; }

// Row m's scale of a matmul output (1 without fp8 activations). Kernels read it once, before anything
// (possibly the same buffer) is written.
__device__ __forceinline__ float mat_row_scale(const MatOut& o, int m) { return o.rs ? o.rs[m] : 1.f; }

// Element (m, c) of a matmul output: the split-K partials summed in order, times the row scale rs (from
// mat_row_scale) and the channel scale.
__device__ __forceinline__ float mat_at(const MatOut& o, int m, int c, float rs) {
  const float* p = o.y + size_t(m) * o.ld + c;
  float v = p[0];
  for (int s = 1; s < o.splits; ++s) v += p[s * o.stride];
  v = v * rs;
  if (o.cs) v = v * o.cs[c];
  return v;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

}  // namespace alpamayo::ALP_CUDA_NS::kern
