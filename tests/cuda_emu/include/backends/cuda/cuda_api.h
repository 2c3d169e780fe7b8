// The cuda_emu backend's CUDA runtime and cuBLASLt: the fake of fake_cuda.h, found before
// src/backends/cuda/cuda_api.h on this target's include path.
#pragma once
#include "fake_cuda.h"
