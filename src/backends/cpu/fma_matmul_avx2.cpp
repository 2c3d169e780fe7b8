// The AVX2 + FMA kernel of fma_matmul.h (compiled with -mavx2 -mfma and without AVX-512, CMakeLists.txt; called
// only where isa().has(kAvx2Fma)). Panels of 16 columns; per span, panel and block of kKB rows of K the bf16 (or s8)
// weights are widened into an fp32 block in L1 (16 KB) and multiplied with every row of x (widened once per call)
// by a register tile of up to 6 rows x 16 columns: 12 ymm accumulators, 2 weight vectors per k, one broadcast.
// Accumulators start at 0 and go back to y between K blocks, so each output element is the single fp32 FMA chain
// over k = 0..K-1 (fma_matmul.h): bitwise the AVX-512 kernel's result. The weights are prefetched into L2 256 KB
// ahead of the block being widened.
//
// Like fma_matmul_avx512.cpp: no inline or template function with external linkage may be instantiated here.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/fma_matmul.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 16;   // columns per panel: 2 ymm
constexpr int kMR = 6;    // rows per register tile
constexpr int kKB = 256;  // rows of K per widened block: 256 x 16 fp32 = 16 KB
static_assert(kKB * kNR <= kFmaKBlock * 64, "the widened block must fit fma_scratch_bytes()");
static_assert(kFmaKSpan % kKB == 0, "K blocks must not straddle spans");

// Weights are prefetched into L2 this far ahead of the block being widened (measured on cold weights,
// bench_matmul --fma: one block ahead left the down slice at 40% of its hot speed; 256 KB ahead, 85-90%).
constexpr int kAhead = 256 << 10;

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

__attribute__((always_inline)) inline float bf16_to_f32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v{uint32_t(h) << 16};
  return v.f;
}

__attribute__((always_inline)) inline __m256 widen8(__m128i v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// xf[m][k] = x[m][k] as fp32, [M][K] dense.
void widen_x(const uint16_t* x, int M, int ldx, int K, float* xf) {
  for (int m = 0; m < M; ++m) {
    const uint16_t* src = x + int64_t(m) * ldx;
    float* dst = xf + int64_t(m) * K;
    int k = 0;
    for (; k + 8 <= K; k += 8)
      _mm256_storeu_ps(dst + k, widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
    for (; k < K; ++k) dst[k] = bf16_to_f32(src[k]);
  }
}

// int8 activations: xf[m][k] = x[m][k] - 128 (the quantized value q), exact.
void widen_x(const uint8_t* x, int M, int ldx, int K, float* xf) {
  const __m256i shift = _mm256_set1_epi32(128);
  for (int m = 0; m < M; ++m) {
    const uint8_t* src = x + int64_t(m) * ldx;
    float* dst = xf + int64_t(m) * K;
    int k = 0;
    for (; k + 8 <= K; k += 8)
      _mm256_storeu_ps(dst + k, _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + k))), shift)));
    for (; k < K; ++k) dst[k] = float(int(src[k]) - 128);
  }
}

// dst [kb][16] fp32 = src [kb][16] bf16.
void widen_block(const uint16_t* src, int kb, float* dst) {
  for (int i = 0; i < kb * kNR; i += 8)
    _mm256_store_ps(dst + i, widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
}

// dst [kb][16] fp32 = src [kb][16] s8.
void widen_block(const int8_t* src, int kb, float* dst) {
  for (int i = 0; i < kb * kNR; i += 8)
    _mm256_store_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)))));
}

// y[r][0..16) (+)= sum over the block's kb rows, for R rows of xf; y dense in its 16 columns.
template <int R>
void tile(const float* xf, int ldxf, const float* wb, int kb, float* y, int ldy, bool first) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + int64_t(r) * ldy);
    acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + int64_t(r) * ldy + 8);
  }
  for (int k = 0; k < kb; ++k) {
    const __m256 w0 = _mm256_load_ps(wb + k * kNR), w1 = _mm256_load_ps(wb + k * kNR + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(xf + int64_t(r) * ldxf + k);
      acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(y + int64_t(r) * ldy, acc[r][0]);
    _mm256_storeu_ps(y + int64_t(r) * ldy + 8, acc[r][1]);
  }
}

void tile_rows(int R, const float* xf, int ldxf, const float* wb, int kb, float* y, int ldy, bool first) {
  switch (R) {
    case 6: tile<6>(xf, ldxf, wb, kb, y, ldy, first); break;
    case 5: tile<5>(xf, ldxf, wb, kb, y, ldy, first); break;
    case 4: tile<4>(xf, ldxf, wb, kb, y, ldy, first); break;
    case 3: tile<3>(xf, ldxf, wb, kb, y, ldy, first); break;
    case 2: tile<2>(xf, ldxf, wb, kb, y, ldy, first); break;
    default: tile<1>(xf, ldxf, wb, kb, y, ldy, first); break;
  }
}

// T: the weights' element (bf16 bits or s8), X: the activations' (bf16 bits or u8 = q + 128).
template <class T, class X>
void run(const T* w, int K, int N, const X* x, int M, int ldx, float* y, int ldy, float* scratch) {
  if (M <= 0 || N <= 0) return;
  float* xf = scratch;
  float* wb = scratch + (int64_t(M) * K + 15) / 16 * 16;  // 64-byte aligned (scratch is)
  widen_x(x, M, ldx, K, xf);
  const int panels = (N + kNR - 1) / kNR, tiles = (M + kMR - 1) / kMR;
  constexpr int kLines = kKB * kNR * int(sizeof(T)) / 64;  // cache lines of one packed block
  const int per_tile = (kLines + tiles - 1) / tiles;
  alignas(32) float part[kMR * kNR];  // the last panel's valid columns go through here
  const T* src = w;  // the packed weights, read in order: spans, panels, rows
  for (int s0 = 0; s0 < K; s0 += kFmaKSpan) {
    const int s1 = imin(K, s0 + kFmaKSpan);
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      float* yp = y + int64_t(p) * kNR;
      for (int k0 = s0; k0 < s1; k0 += kKB) {
        const int kb = imin(kKB, s1 - k0);
        widen_block(src, kb, wb);
        src += kb * kNR;
        // The weights are read strictly sequentially; prefetching past their end is harmless.
        const char* next = reinterpret_cast<const char*>(src) + kAhead;
        for (int t = 0; t < tiles; ++t) {
          const int l0 = t * per_tile, l1 = imin(kLines, l0 + per_tile);
          for (int l = l0; l < l1; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
          const int m0 = t * kMR, R = imin(kMR, M - m0);
          const float* xt = xf + int64_t(m0) * K + k0;
          float* yt = yp + int64_t(m0) * ldy;
          if (valid == kNR) {
            tile_rows(R, xt, K, wb, kb, yt, ldy, k0 == 0);
            continue;
          }
          for (int r = 0; r < R; ++r)
            for (int c = 0; c < kNR; ++c) part[r * kNR + c] = k0 > 0 && c < valid ? yt[int64_t(r) * ldy + c] : 0.f;
          tile_rows(R, xt, K, wb, kb, part, kNR, k0 == 0);
          for (int r = 0; r < R; ++r)
            for (int c = 0; c < valid; ++c) yt[int64_t(r) * ldy + c] = part[r * kNR + c];
        }
      }
    }
  }
}

}  // namespace

void fma_matmul_avx2(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                     float* scratch) {
  run(w, K, N, x, M, ldx, y, ldy, scratch);
}

void fma_matmul_s8_avx2(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                        float* scratch) {
  run(w, K, N, x, M, ldx, y, ldy, scratch);
}

}  // namespace alpamayo::cpu
