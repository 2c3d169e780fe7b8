// The int8 dot-product kernel of fma_matmul.h for CPUs without VNNI, "avx2_int8" (compiled with the AVX2 baseline
// flags, CMakeLists.txt; called only where isa().has(kAvx2Fma)). The exact int32 sum of q_x * w, rounded once to
// fp32: the same bits as avx512_vnni.
//
// vpmaddubsw multiplies u8 by s8 and adds adjacent products into an int16 with saturation, so u8 = q + 128 against
// weights of full range would saturate (255 * 127 * 2 > 32767: oneDNN's AVX2 int8 path does, cpu_backend.cpp).
// Here the u8 operand is |q| (0..128) and the s8 one is w with q's sign (vpsignb; |w| <= 127, so it cannot wrap):
// each product is q * w, and a pair sums to at most 2 * 128 * 127 = 32512. vpmaddwd with ones then adds the two
// pairs of a group of 4 k into int32 lanes, and vpaddd accumulates. On AMD Zen 3 that sequence runs 1.4 times the
// int8 multiply-adds per cycle of fp32 FMAs on widened int8 (docs/PERFORMANCE.md).
//
// Layout (FmaWeights::pack_s8 for this kernel): panels of 16 columns, K in spans of kDotKSpan rows, and within a
// span-panel the rows go in groups of 4 k, [ceil(ks/4)][16][4] bytes zero-padded: one 64-byte line per group, two
// ymm of 8 columns. Per span and panel a register tile of up to 4 rows x 16 columns walks all the span's groups:
// 8 int32 accumulators, 2 weight vectors, and per row and group a broadcast dword of q and one of |q| (prepared
// once per call, as x's rows rounded up to the group with zeros). The span-panel (at most 128 KB) comes from DRAM
// for the first row tile and from L1/L2 for the others. Sums go back to y as int32 between spans and fp32 after
// the last.
//
// Nothing here may instantiate an inline or template function with external linkage (scripts/check-isa-objects.sh).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/fma_matmul.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 16;  // columns per panel: 2 ymm of 8 columns x 4 k
constexpr int kMR = 4;   // rows per register tile: 8 accumulators + 2 weights + 2 broadcasts + ones + a temporary

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

__attribute__((always_inline)) inline int32_t load_dword(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Row m of x (u8 = q + 128) as q (s8) and |q| (u8) in rows of Kg >= K, the padding zero.
void prepare(const uint8_t* x, int M, int ldx, int K, int Kg, int8_t* q, uint8_t* a) {
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  for (int m = 0; m < M; ++m) {
    const uint8_t* src = x + int64_t(m) * ldx;
    int8_t* qr = q + int64_t(m) * Kg;
    uint8_t* ar = a + int64_t(m) * Kg;
    int k = 0;
    for (; k + 32 <= K; k += 32) {
      const __m256i s = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k)), bias);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + k), s);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ar + k), _mm256_abs_epi8(s));  // |-128| = 0x80 = 128 as u8
    }
    for (; k < K; ++k) {
      const int v = int(src[k]) - 128;
      qr[k] = static_cast<int8_t>(v);
      ar[k] = static_cast<uint8_t>(v < 0 ? -v : v);
    }
    for (; k < Kg; ++k) qr[k] = 0, ar[k] = 0;
  }
}

// Rows [0, R) of a tile over the ng groups of one span-panel wp ([ng][16][4]); q, a: the span's first k of row 0
// (row stride ld). first: start from 0, else from the int32 partials in y. last: store fp32, else int32 partials.
template <int R>
void tile(const int8_t* q, const uint8_t* a, int64_t ld, const int8_t* wp, int ng, float* y, int ldy, bool first,
          bool last, const __m256i* mask) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][2];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j)
      acc[r][j] = first ? _mm256_setzero_si256()
                        : _mm256_maskload_epi32(reinterpret_cast<const int*>(y + int64_t(r) * ldy + 8 * j), mask[j]);
  for (int g = 0; g < ng; ++g) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 64 * g));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 64 * g + 32));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i qb = _mm256_set1_epi32(load_dword(q + r * ld + 4 * g));
      const __m256i ab = _mm256_set1_epi32(load_dword(a + r * ld + 4 * g));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ab, _mm256_sign_epi8(w0, qb)), ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ab, _mm256_sign_epi8(w1, qb)), ones));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      float* dst = y + int64_t(r) * ldy + 8 * j;
      if (last)
        _mm256_maskstore_ps(dst, mask[j], _mm256_cvtepi32_ps(acc[r][j]));
      else
        _mm256_maskstore_epi32(reinterpret_cast<int*>(dst), mask[j], acc[r][j]);
    }
}

void tile_rows(int R, const int8_t* q, const uint8_t* a, int64_t ld, const int8_t* wp, int ng, float* y, int ldy,
               bool first, bool last, const __m256i* mask) {
  switch (R) {
    case 4: tile<4>(q, a, ld, wp, ng, y, ldy, first, last, mask); break;
    case 3: tile<3>(q, a, ld, wp, ng, y, ldy, first, last, mask); break;
    case 2: tile<2>(q, a, ld, wp, ng, y, ldy, first, last, mask); break;
    default: tile<1>(q, a, ld, wp, ng, y, ldy, first, last, mask); break;
  }
}

}  // namespace

void dot_matmul_s8_avx2(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                        uint8_t* scratch) {
  if (M <= 0 || N <= 0) return;
  const int Kg = (K + 3) / 4 * 4;
  auto* q = reinterpret_cast<int8_t*>(scratch);
  uint8_t* a = scratch + int64_t(M) * Kg;
  prepare(x, M, ldx, K, Kg, q, a);
  const int panels = (N + kNR - 1) / kNR;
  const int8_t* src = w;  // the packed weights, in order: spans, panels, groups
  for (int s0 = 0; s0 < K; s0 += kDotKSpan) {
    const int s1 = imin(K, s0 + kDotKSpan), ng = (s1 - s0 + 3) / 4;
    const bool first = s0 == 0, last = s1 == K;
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      __m256i mask[2];
      for (int j = 0; j < 2; ++j) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        mask[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8 * j), lane);
      }
      for (int m0 = 0; m0 < M; m0 += kMR)
        tile_rows(imin(kMR, M - m0), q + int64_t(m0) * Kg + s0, a + int64_t(m0) * Kg + s0, Kg, src, ng,
                  y + int64_t(m0) * ldy + int64_t(p) * kNR, ldy, first, last, mask);
      src += int64_t(ng) * 4 * kNR;
    }
  }
}

}  // namespace alpamayo::cpu
