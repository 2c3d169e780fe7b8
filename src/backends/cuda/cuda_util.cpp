#include "backends/cuda/cuda_util.h"

#include "alpamayo/error.h"

namespace alpamayo::ALP_CUDA_NS {

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::OutOfMemory : ErrorCode::Internal, std::string("cuda backend: ") + what + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    p_ = nullptr;
    (void)cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
    throw Error(ErrorCode::OutOfMemory, "cuda backend: cannot allocate " + std::to_string(bytes) +
                " bytes of device memory: " + cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) (void)cudaFree(p_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) (void)cudaFree(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMallocHost(&p_, bytes);
  if (e != cudaSuccess) {
    p_ = nullptr;
    (void)cudaGetLastError();
    throw Error(ErrorCode::OutOfMemory, "cuda backend: cannot allocate " + std::to_string(bytes) +
                " bytes of pinned host memory: " + cudaGetErrorString(e));
  }
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) (void)cudaFreeHost(p_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) (void)cudaFreeHost(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

DeviceGuard::DeviceGuard(int device) {
  ALP_CUDA(cudaGetDevice(&prev_));
  if (prev_ != device) {
    ALP_CUDA(cudaSetDevice(device));
    restore_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (restore_) (void)cudaSetDevice(prev_);
}

}  // namespace alpamayo::ALP_CUDA_NS
