// Device helpers shared by the cuda backend's kernels: warp and block reductions (fixed order, so results
// are bitwise reproducible), bf16 / fp8 conversions, matmul-output reads, and the tensor-core and
// asynchronous-copy primitives (inline PTX).
//
// The kernels live in *.cuh files in namespace alpamayo::ALP_CUDA_NS::ALP_KERNEL_NS, included by the .cu files
// that launch them. Compiled with ALPAMAYO_SIMT_EMU (and another ALP_KERNEL_NS), the same source runs on
// the host in the SIMT emulator of simt_emu.h, which is how the tests check the kernels without a GPU.
#pragma once
#include <cstdint>

#ifdef ALPAMAYO_SIMT_EMU
#include "backends/cuda/simt_emu.h"
#define ALP_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::simt::dynamic_smem())
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#define ALP_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

#include "backends/cuda/kernels.h"

// A kernel launch: `ALP_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...)`. Over the fake runtime of
// the tests it enqueues the kernel for the SIMT emulator instead.
#ifdef ALPAMAYO_CUDA_EMU
#define ALP_LAUNCH(kernel, grid, block, smem, stream) \
  ::alpamayo::ALP_CUDA_NS::fake_launch(kernel, grid, block, smem, stream)
#else
#define ALP_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif

#ifndef ALP_KERNEL_NS
#define ALP_KERNEL_NS kern
#endif

namespace alpamayo::ALP_CUDA_NS::ALP_KERNEL_NS {

// Threads of the one-block-per-row kernels (any multiple of 32 works; the SIMT emulator runs them with fewer).
#ifndef ALP_ROW_THREADS
#define ALP_ROW_THREADS 256
#endif
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

#ifndef ALPAMAYO_SIMT_EMU
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; bytes beyond src_bytes (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// D += A B: A 16x16 bf16 (row-major fragment a[4]), B 16x8 bf16 (column fragment b0, b1), D 16x8 fp32.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices, transposed on load: lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
#else
using ::simt::cp_async16;
using ::simt::cp_async_commit;
using ::simt::cp_async_wait;
using ::simt::ldmatrix_x4_trans;
using ::simt::mma_bf16;
#endif

}  // namespace alpamayo::ALP_CUDA_NS::ALP_KERNEL_NS
