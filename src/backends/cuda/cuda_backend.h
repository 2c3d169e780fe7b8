// The cuda backend (docs/CUDA_BACKEND.md): weights uploaded once (bf16, or fp8 e4m3 with per-output-channel
// scales), the whole denoising loop on one NVIDIA GPU, captured once per bind as one CUDA graph.
// This header is plain C++: the registry includes it without the CUDA toolkit's headers.
#pragma once
#include "alpamayo/backend.h"
#include "backends/cuda/cuda_ns.h"

namespace alpamayo::ALP_CUDA_NS {

// The backend's entry in the registry (src/backends/registry.cpp): its name, formats, loader, and the probe that
// says why it cannot run on this machine (no driver, no device, a device older than sm_80; probed once per
// process). The test-only cuda_emu backend registers a copy of it with its own name, loader and probe.
BackendInfo backend_info();

}  // namespace alpamayo::ALP_CUDA_NS
