// Error checks and owning device / pinned host buffers for the cuda backend. Library code throws
// alpamayo::Error naming the failed call; destructors never throw.
#pragma once
#include <cstddef>
#include <string>

#include "backends/cuda/cuda_api.h"
#include "backends/cuda/cuda_ns.h"

namespace alpamayo::ALP_CUDA_NS {

// Throws alpamayo::Error("cuda backend: <what> failed: <name>: <description>") unless e == cudaSuccess.
void check_cuda(cudaError_t e, const char* what);
#define ALP_CUDA(call) ::alpamayo::ALP_CUDA_NS::check_cuda((call), #call)
// After a kernel launch: a bad launch configuration is reported here, naming the kernel.
#define ALP_LAUNCHED(name) ::alpamayo::ALP_CUDA_NS::check_cuda(cudaGetLastError(), "launch of " name)

inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// cudaMalloc'd memory, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  size_t bytes() const { return n_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory (cudaMallocHost) for asynchronous copies. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* get() const { return p_; }
  size_t bytes() const { return n_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Makes `device` current for the calling thread and restores the previous device on destruction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool restore_ = false;
};

}  // namespace alpamayo::ALP_CUDA_NS
