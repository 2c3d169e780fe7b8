// The cuda backend's namespace, alpamayo::ALP_CUDA_NS (default alpamayo::cuda). The tests compile the whole
// backend a second time over a fake CUDA runtime (fake_cuda.h) under another name, so both can be linked
// into one test binary.
#pragma once
#ifndef ALP_CUDA_NS
#define ALP_CUDA_NS cuda
#endif
