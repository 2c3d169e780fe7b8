// Register-only loops of the AVX2-era multiply-add instructions (peaks.h): fp32 FMA on ymm, vpmaddubsw's int8, and
// AVX-VNNI's vpdpbusd on ymm (a function-level target: AVX-VNNI is not part of the AVX2 baseline; called only
// after the isa() check). An ISA translation unit (AVX2 flags, CMakeLists.txt).
#include <immintrin.h>

#include "backends/cpu/peaks.h"

namespace alpamayo::cpu {

float peak_loop_fma_ymm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 8 * 2;
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(seed * 1e-3f);
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(seed + i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[7];
}

// The int8 unit of AVX2 as the int8 kernels without VNNI use it: vpmaddubsw (u8 x s8, adjacent products added in
// int16), vpmaddwd with ones (pairs of those into int32), vpaddd; 32 multiply-adds per chain and iteration. The
// operands pass through an empty asm so that the compiler cannot hoist the products out of the loop.
float peak_loop_maddubs_ymm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 32 * 2;
  __m256i a = _mm256_set1_epi32(0x01020304 + static_cast<int>(seed)), b = _mm256_set1_epi32(0x01010101);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  for (long it = 0; it < iters; ++it) {
    asm volatile("" : "+x"(a), "+x"(b));
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      __m256i p = _mm256_maddubs_epi16(a, b);
      asm volatile("" : "+x"(p));
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, ones));
    }
  }
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return static_cast<float>(out[0] + out[7]);
}

__attribute__((target("avx2,avxvnni"))) float peak_loop_dpbusd_ymm_vex(long iters, float seed,
                                                                        double* ops_per_iter) {
  *ops_per_iter = 12.0 * 8 * 4 * 2;
  const __m256i a = _mm256_set1_epi32(0x01020304 + static_cast<int>(seed)), b = _mm256_set1_epi32(0x01010101);
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_dpbusd_avx_epi32(acc[i], a, b);
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return static_cast<float>(out[0] + out[7]);
}

}  // namespace alpamayo::cpu
