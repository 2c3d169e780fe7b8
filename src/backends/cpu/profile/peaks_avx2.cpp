// Register-only loops of the AVX2-era multiply-add instructions (peaks.h): fp32 FMA on ymm, vpmaddwd's int16 pairs, and
// AVX-VNNI's vpdpbusd on ymm (a function-level target: AVX-VNNI is not part of the AVX2 baseline; called only
// after the isa() check). An ISA translation unit (AVX2 flags, CMakeLists.txt).
#include <immintrin.h>

#include "backends/cpu/profile/peaks.h"

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

// The int8 unit of AVX2 as the exact int8 kernel without VNNI uses it (dot_matmul_avx2.cpp): vpmaddwd on int16
// pairs into int32, vpaddd; 16 multiply-adds per chain and iteration. One asm block over twelve named accumulators:
// from intrinsics the products of equal operands are computed once and shared, and an array of asm operands is
// kept on the stack.
float peak_loop_maddwd_ymm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2;
  const __m256i a = _mm256_set1_epi32(0x00010002 + static_cast<int>(seed)), b = _mm256_set1_epi32(0x00010001);
  __m256i c0 = _mm256_set1_epi32(0), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
          c9 = c0, c10 = c0, c11 = c0;
#define ALPAMAYO_MADD(c, t) "vpmaddwd %[a], %[b], %%ymm" #t "\n\tvpaddd %%ymm" #t ", %[" #c "], %[" #c "]\n\t"
  for (long it = 0; it < iters; ++it)
    asm(ALPAMAYO_MADD(c0, 14) ALPAMAYO_MADD(c1, 15) ALPAMAYO_MADD(c2, 14) ALPAMAYO_MADD(c3, 15) ALPAMAYO_MADD(c4, 14)
            ALPAMAYO_MADD(c5, 15) ALPAMAYO_MADD(c6, 14) ALPAMAYO_MADD(c7, 15) ALPAMAYO_MADD(c8, 14) ALPAMAYO_MADD(c9, 15)
                ALPAMAYO_MADD(c10, 14) ALPAMAYO_MADD(c11, 15)
        : [c0] "+x"(c0), [c1] "+x"(c1), [c2] "+x"(c2), [c3] "+x"(c3), [c4] "+x"(c4), [c5] "+x"(c5), [c6] "+x"(c6),
          [c7] "+x"(c7), [c8] "+x"(c8), [c9] "+x"(c9), [c10] "+x"(c10), [c11] "+x"(c11)
        : [a] "x"(a), [b] "x"(b)
        : "xmm14", "xmm15");
#undef ALPAMAYO_MADD
  const __m256i s = _mm256_add_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                       _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7))),
      _mm256_add_epi32(_mm256_add_epi32(c8, c9), _mm256_add_epi32(c10, c11)));
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
