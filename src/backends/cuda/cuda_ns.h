// The cuda backend's namespace, alpamayo::ALP_CUDA_NS. The test-only cuda_emu backend (tests/cuda_emu) compiles
// these same sources over a fake runtime with its own copy of this header found first on its include path, so
// that both builds of the backend can be linked into one program.
#pragma once
#define ALP_CUDA_NS cuda
