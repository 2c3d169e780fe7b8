// The cpu backend's int8 cache rows (kv int8, src/backends/kv_int8.h): one row of d values quantised, stored with
// a bias (128 for keys, which the vpdpbusd kernel reads as u8; 0 for values).
#pragma once
#include <cstdint>

namespace alpamayo::cpu {

// x: d bf16 values (bf16 = true) or d fp32 ones; q[c] = quantize_row_s8's q[c] + bias (as a byte). Returns the
// scale (NaN for a row with a NaN or infinity, whose q are all `bias`). AVX2 (kv_quant_avx2.cpp): the portable
// build's baseline.
float quantize_row_avx2(const void* x, bool bf16, int d, int bias, int8_t* q);

}  // namespace alpamayo::cpu
