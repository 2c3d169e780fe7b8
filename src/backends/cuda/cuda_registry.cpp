// The cuda backend's registry entry (src/backends/registry.cpp lists it). Plain C++: no CUDA header needed.
#include "backends/cuda/cuda_backend.h"

namespace alpamayo {

BackendInfo cuda_backend_info() {
  BackendInfo b;
  b.name = "cuda";
  b.weight_formats = {"bf16", "fp8"};
  b.kv_formats = {"bf16"};
  b.load = load_cuda_backend;
  b.unavailable = cuda_unavailable;
  // Weights live in device memory (the backend checks that memory itself); the host holds only the action
  // projections, which every backend's estimate counts. Shared prompts, suffix rows, left padding and guidance
  // are not implemented on this backend yet (docs/CUDA_BACKEND.md).
  b.features.device_memory = true;
  // Attention's grid puts B * Hkv in the y dimension, at most 65535 blocks.
  b.features.max_batch = [](const ExpertConfig& c) { return int64_t(65535 / c.Hkv); };
  return b;
}

}  // namespace alpamayo
