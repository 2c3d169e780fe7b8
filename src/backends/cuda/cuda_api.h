// The CUDA runtime and cuBLASLt as the backend's host code calls them: every host source of the backend reaches
// them through this header (via cuda_util.h or gemm.h). The test-only cuda_emu backend (tests/cuda_emu) puts a
// header of the same path first on its include path, which supplies a fake runtime instead.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>
