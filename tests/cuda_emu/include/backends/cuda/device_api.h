// The cuda_emu backend's kernel toolchain, found before src/backends/cuda/device_api.h on this target's include
// path: the kernel source runs on the host in the SIMT emulator (simt_emu.h), each launch enqueued on the fake
// runtime's stream (fake_cuda.h), so it runs in stream order and can be captured into a fake graph.
#pragma once
#include <cstdint>

#include "backends/cuda/cuda_ns.h"
#include "fake_cuda.h"
#include "simt_emu.h"

#define ALP_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::simt::dynamic_smem())

// ALP_LAUNCH(kernel, grid, block, smem, stream)(args...): the SIMT emulator, in stream order.
#define ALP_LAUNCH(kernel, grid, block, smem, stream) \
  ::alpamayo::ALP_CUDA_NS::kern::emulated_launch(kernel, grid, block, smem, stream)

// Fewer emulated threads per row kernel than on a GPU: the kernels loop over any block width.
#define ALP_ROW_THREADS 64

namespace alpamayo::ALP_CUDA_NS::kern {

template <class... P>
auto emulated_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
  return [=](auto... args) {
    if (!fake_cuda::capturing(s)) ++fake_cuda::counters().eager_kernels;
    fake_cuda::enqueue(s, [=] { simt::launch(kernel, grid, block, smem, P(args)...); });
  };
}

using ::simt::cp_async16;
using ::simt::cp_async_commit;
using ::simt::cp_async_wait;
using ::simt::ldmatrix_x4_trans;
using ::simt::mma_bf16;

}  // namespace alpamayo::ALP_CUDA_NS::kern
