// What the kernel sources (*.cuh, through kernels_common.cuh) take from the CUDA toolchain: the device headers,
// dynamic shared memory, the launch syntax, the block width of the row kernels, and the tensor-core and
// asynchronous-copy primitives (inline PTX). The test-only cuda_emu backend (tests/cuda_emu) puts a header of
// the same path first on its include path, which runs the same kernel source in a host SIMT emulator.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_ns.h"

#define ALP_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]

// A kernel launch: `ALP_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...)`.
#define ALP_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>

// Threads of the one-block-per-row kernels (any multiple of 32 works).
#define ALP_ROW_THREADS 256

namespace alpamayo::ALP_CUDA_NS::kern {

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

}  // namespace alpamayo::ALP_CUDA_NS::kern
