// The AVX2 + FMA kernel of matmul_kernels.h (compiled with -mavx2 -mfma and without AVX-512, CMakeLists.txt; called
// only where isa().has(kAvx2Fma)). Panels of 16 columns; per span, panel and block of kKB rows of K the bf16 (or s8)
// weights are multiplied with every row of x by a register tile of up to 6 rows x 16 columns: 12 ymm
// accumulators, 2 weight vectors per k, one broadcast. As in fma_matmul_avx512.cpp: the block's first tile widens
// the weights in registers and leaves them, fp32, in a 16 KB block for the others; x is widened block by block;
// the partial sums stay in a dense panel buffer between the blocks of a span and reach y only at its end. Each
// output element is the single fp32 FMA chain over k = 0..K-1 (matmul_kernels.h): bitwise the AVX-512 kernel's
// result. The weights are prefetched into L2 256 KB ahead of the block in use and the next block into L1.
//
// Like fma_matmul_avx512.cpp: no inline or template function with external linkage may be instantiated here.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 16;   // columns per panel: 2 ymm
constexpr int kMR = 6;    // rows per register tile
constexpr int kKB = 256;  // rows of K per widened block: 256 x 16 fp32 = 16 KB
static_assert(kKB * kNR <= kFmaKBlock * 64, "the widened block must fit matmul_scratch_bytes()");
static_assert(kFmaKSpan % kKB == 0, "K blocks must not straddle spans");

// Weights are prefetched into L2 this far ahead of the block being widened: one block ahead left cold weights
// far below their hot speed (docs/PERFORMANCE.md, "Measurements behind design choices").
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

// 8 activations widened to fp32: bf16 exactly, int8 (u8 = q + 128) as q.
__attribute__((always_inline)) inline __m256 widen_x8(const uint16_t* src) {
  return widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}
__attribute__((always_inline)) inline __m256 widen_x8(const uint8_t* src) {
  const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(u, _mm256_set1_epi32(128)));
}
__attribute__((always_inline)) inline float widen_x1(uint16_t v) { return bf16_to_f32(v); }
__attribute__((always_inline)) inline float widen_x1(uint8_t v) { return float(int(v) - 128); }

// x widened to fp32 block by block: block b (rows k0 = b * kKB .. k0 + kb of K) holds [M][kb] at xf + k0 * M, so a
// row tile reads its rows of a block from one contiguous stretch.
template <class X>
void widen_x(const X* x, int M, int ldx, int K, float* xf) {
  for (int k0 = 0; k0 < K; k0 += kKB) {
    const int kb = imin(kKB, K - k0);
    float* dst = xf + int64_t(k0) * M;
    for (int m = 0; m < M; ++m, dst += kb) {
      const X* src = x + int64_t(m) * ldx + k0;
      int k = 0;
      for (; k + 8 <= kb; k += 8) _mm256_storeu_ps(dst + k, widen_x8(src + k));
      for (; k < kb; ++k) dst[k] = widen_x1(src[k]);
    }
  }
}

// One packed row of 16 weights widened to fp32 (exact): columns 0..7 in w0, 8..15 in w1.
__attribute__((always_inline)) inline void widen_row16(const uint16_t* src, __m256& w0, __m256& w1) {
  w0 = widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  w1 = widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8)));
}
__attribute__((always_inline)) inline void widen_row16(const int8_t* src, __m256& w0, __m256& w1) {
  w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src))));
  w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8))));
}

// Rows [0, R) of a register tile over the block's kb rows, partial sums in yb ([R][16], dense): they start at 0
// (first) or at yb's. kWiden: the block's first tile widens the packed weights src itself and leaves them in wb
// for the other tiles (its loads then overlap its FMAs).
template <int R, bool kWiden, class T>
void tile(const float* xf, int ldxf, const T* src, float* wb, int kb, float* yb, bool first) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = first ? _mm256_setzero_ps() : _mm256_load_ps(yb + r * kNR);
    acc[r][1] = first ? _mm256_setzero_ps() : _mm256_load_ps(yb + r * kNR + 8);
  }
  for (int k = 0; k < kb; ++k) {
    __m256 w0, w1;
    if constexpr (kWiden) {
      widen_row16(src + k * kNR, w0, w1);
      _mm256_store_ps(wb + k * kNR, w0);
      _mm256_store_ps(wb + k * kNR + 8, w1);
    } else {
      w0 = _mm256_load_ps(wb + k * kNR);
      w1 = _mm256_load_ps(wb + k * kNR + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(xf + int64_t(r) * ldxf + k);
      acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(yb + r * kNR, acc[r][0]);
    _mm256_store_ps(yb + r * kNR + 8, acc[r][1]);
  }
}

template <bool kWiden, class T>
void tile_rows(int R, const float* xf, int ldxf, const T* src, float* wb, int kb, float* yb, bool first) {
  switch (R) {
    case 6: tile<6, kWiden>(xf, ldxf, src, wb, kb, yb, first); break;
    case 5: tile<5, kWiden>(xf, ldxf, src, wb, kb, yb, first); break;
    case 4: tile<4, kWiden>(xf, ldxf, src, wb, kb, yb, first); break;
    case 3: tile<3, kWiden>(xf, ldxf, src, wb, kb, yb, first); break;
    case 2: tile<2, kWiden>(xf, ldxf, src, wb, kb, yb, first); break;
    default: tile<1, kWiden>(xf, ldxf, src, wb, kb, yb, first); break;
  }
}

// T: the weights' element (bf16 bits or s8), X: the activations' (bf16 bits or u8 = q + 128).
template <class T, class X>
void run(const T* w, int K, int N, const X* x, int M, int ldx, float* y, int ldy, float* scratch, bool x_ready) {
  if (M <= 0 || N <= 0) return;
  float* xf = scratch;
  float* wb = scratch + (int64_t(M) * K + 15) / 16 * 16;  // 64-byte aligned (scratch is)
  float* yb = wb + kFmaKBlock * 64;                           // [M][16]: one panel's partial sums
  if (!x_ready) widen_x(x, M, ldx, K, xf);
  const int panels = (N + kNR - 1) / kNR, tiles = (M + kMR - 1) / kMR;
  constexpr int kLines = kKB * kNR * int(sizeof(T)) / 64;  // cache lines of one packed block
  const int per_tile = (kLines + tiles - 1) / tiles;
  const T* src = w;  // the packed weights, read in order: spans, panels, rows
  for (int s0 = 0; s0 < K; s0 += kFmaKSpan) {
    const int s1 = imin(K, s0 + kFmaKSpan);
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      float* yp = y + int64_t(p) * kNR;
      // The panel's sums stay in yb (dense, all 16 columns) between the blocks of a span: from y when an earlier
      // span left some, back to y's valid columns at the span's end.
      if (s0 > 0)
        for (int m = 0; m < M; ++m)
          for (int c = 0; c < kNR; ++c) yb[m * kNR + c] = c < valid ? yp[int64_t(m) * ldy + c] : 0.f;
      for (int k0 = s0; k0 < s1; k0 += kKB) {
        const int kb = imin(kKB, s1 - k0);
        const T* blk = src;
        src += kb * kNR;
        // The weights are read strictly sequentially; prefetching past their end is harmless.
        const char* next = reinterpret_cast<const char*>(src) + kAhead;
        for (int t = 0; t < tiles; ++t) {
          const int l0 = t * per_tile, l1 = imin(kLines, l0 + per_tile);
          for (int l = l0; l < l1; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
          for (int l = l0; l < l1; ++l) _mm_prefetch(reinterpret_cast<const char*>(src) + 64 * l, _MM_HINT_T0);
          const int m0 = t * kMR, R = imin(kMR, M - m0);
          const float* xt = xf + int64_t(k0) * M + int64_t(m0) * kb;
          if (t == 0) tile_rows<true>(R, xt, kb, blk, wb, kb, yb + m0 * kNR, k0 == 0);
          else tile_rows<false>(R, xt, kb, blk, wb, kb, yb + m0 * kNR, k0 == 0);
        }
      }
      for (int m = 0; m < M; ++m) {
        if (valid == kNR) {
          _mm256_storeu_ps(yp + int64_t(m) * ldy, _mm256_load_ps(yb + m * kNR));
          _mm256_storeu_ps(yp + int64_t(m) * ldy + 8, _mm256_load_ps(yb + m * kNR + 8));
        } else {
          for (int c = 0; c < valid; ++c) yp[int64_t(m) * ldy + c] = yb[m * kNR + c];
        }
      }
    }
  }
}

}  // namespace

void fma_matmul_avx2(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                     float* scratch, bool x_ready) {
  run(w, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

void fma_matmul_s8_avx2(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                        float* scratch, bool x_ready) {
  run(w, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

}  // namespace alpamayo::cpu
