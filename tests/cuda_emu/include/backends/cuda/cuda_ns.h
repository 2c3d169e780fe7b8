// The cuda_emu backend's namespace: found before src/backends/cuda/cuda_ns.h on this target's include path, so
// the emulated build of the backend links into one program with the real one.
#pragma once
#define ALP_CUDA_NS cuda_emu
