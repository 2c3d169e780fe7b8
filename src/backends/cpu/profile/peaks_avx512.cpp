// Register-only loops of the AVX-512 multiply-add instructions (peaks.h). An ISA translation unit (AVX-512
// flags, CMakeLists.txt): no weak symbols, no inline functions of headers called.
#include <immintrin.h>

#include "backends/cpu/profile/peaks.h"

namespace alpamayo::cpu {

// 12 accumulators: enough independent chains to cover latency (4-6 cycles) x 2 ports.
float peak_loop_dpbf16_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2 * 2;  // 16 lanes x 2 products x (mul + add)
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3c003c00 + (static_cast<int>(seed) & 1));
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(seed + i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  return out[0] + out[15];
}

float peak_loop_fma_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2;
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(seed * 1e-3f);
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(seed + i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  return out[0] + out[15];
}

float peak_loop_dpbusd_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 4 * 2;  // 16 lanes x 4 products x (mul + add)
  const __m512i a = _mm512_set1_epi32(0x01020304 + static_cast<int>(seed)), b = _mm512_set1_epi32(0x01010101);
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int out[16];
  _mm512_store_si512(out, s);
  return static_cast<float>(out[0] + out[15]);
}

float peak_loop_dpwssd_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2 * 2;  // 16 lanes x 2 products x (mul + add)
  const __m512i a = _mm512_set1_epi32(0x00010002 + static_cast<int>(seed)), b = _mm512_set1_epi32(0x00010001);
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpwssd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int out[16];
  _mm512_store_si512(out, s);
  return static_cast<float>(out[0] + out[15]);
}

float peak_loop_dpbusd_ymm_evex(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 8 * 4 * 2;
  const __m256i a = _mm256_set1_epi32(0x01020304 + static_cast<int>(seed)), b = _mm256_set1_epi32(0x01010101);
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_dpbusd_epi32(acc[i], a, b);
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return static_cast<float>(out[0] + out[7]);
}

}  // namespace alpamayo::cpu
