// The AVX-512F kernel of fma_matmul.h (compiled with AVX-512 flags, CMakeLists.txt; called only where
// isa().has(kAvx512)). Panels of 64 columns; per span, panel and block of kKB rows of K the bf16 (or s8) weights
// are widened into an fp32 block in L1 (16 KB) and multiplied with every row of x (widened once per call) by a
// register tile of up to 6 rows x 64 columns: 24 zmm accumulators, 4 weight vectors per k, one broadcast per row.
// Accumulators start at 0 and go back to y between K blocks, so each output element is the single fp32 FMA chain
// over k = 0..K-1 (fma_matmul.h). The weights are prefetched into L2 256 KB ahead of the block being widened,
// spread over the row tiles.
//
// Nothing here may instantiate an inline or template function with external linkage (std::min, containers):
// the linker could keep this AVX-512 copy for every other translation unit. Everything is in an anonymous
// namespace or a plain loop; `nm -C` of the object shows no weak symbols.
// GCC 12's avx512fintrin.h leaves the pass-through operand of _mm512_cvtepu16_epi32 / _mm512_slli_epi32
// undefined on purpose, and -Wmaybe-uninitialized reports it once inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/fma_matmul.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 64;  // columns per panel: 4 zmm
constexpr int kMR = 6;   // rows per register tile
constexpr int kKB = 64;  // rows of K per widened block: 64 x 64 fp32 = 16 KB
static_assert(kKB * kNR <= kFmaKBlock * 64, "the widened block must fit fma_scratch_bytes()");
static_assert(kFmaKSpan % kKB == 0, "K blocks must not straddle spans");

// Weights are prefetched into L2 this far ahead of the block being widened (measured on cold weights,
// bench_matmul --fma: one block ahead left the down slice at 40% of its hot speed; 256 KB ahead, 85-90%).
constexpr int kAhead = 256 << 10;

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

__attribute__((always_inline)) inline __m512 widen16(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// xf[m][k] = x[m][k] as fp32, [M][K] dense.
void widen_x(const uint16_t* x, int M, int ldx, int K, float* xf) {
  for (int m = 0; m < M; ++m) {
    const uint16_t* src = x + int64_t(m) * ldx;
    float* dst = xf + int64_t(m) * K;
    int k = 0;
    for (; k + 16 <= K; k += 16)
      _mm512_storeu_ps(dst + k, widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k))));
    if (k < K) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1);
      _mm512_mask_storeu_ps(dst + k, mask, widen16(_mm256_maskz_loadu_epi16(mask, src + k)));
    }
  }
}

// int8 activations: xf[m][k] = x[m][k] - 128 (the quantized value q), exact.
void widen_x(const uint8_t* x, int M, int ldx, int K, float* xf) {
  const __m512i shift = _mm512_set1_epi32(128);
  for (int m = 0; m < M; ++m) {
    const uint8_t* src = x + int64_t(m) * ldx;
    float* dst = xf + int64_t(m) * K;
    int k = 0;
    for (; k + 16 <= K; k += 16)
      _mm512_storeu_ps(dst + k, _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                    _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))), shift)));
    if (k < K) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1);
      _mm512_mask_storeu_ps(dst + k, mask,
                            _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, src + k)), shift)));
    }
  }
}

// dst [kb][64] fp32 = src [kb][64] bf16.
void widen_block(const uint16_t* src, int kb, float* dst) {
  for (int i = 0; i < kb * kNR; i += 16)
    _mm512_store_ps(dst + i, widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
}

// dst [kb][64] fp32 = src [kb][64] s8.
void widen_block(const int8_t* src, int kb, float* dst) {
  for (int i = 0; i < kb * kNR; i += 16)
    _mm512_store_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)))));
}

// y[r][0..64) (columns masked by mask[j]) (+)= sum over the block's kb rows, for R rows of xf.
template <int R>
void tile(const float* xf, int ldxf, const float* wb, int kb, float* y, int ldy, bool first, const __mmask16* mask) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      acc[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], y + int64_t(r) * ldy + 16 * j);
  for (int k = 0; k < kb; ++k) {
    const float* w = wb + k * kNR;
    const __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16), w2 = _mm512_load_ps(w + 32),
                 w3 = _mm512_load_ps(w + 48);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(xf[int64_t(r) * ldxf + k]);
      acc[r][0] = _mm512_fmadd_ps(b, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(b, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(b, w3, acc[r][3]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(y + int64_t(r) * ldy + 16 * j, mask[j], acc[r][j]);
}

void tile_rows(int R, const float* xf, int ldxf, const float* wb, int kb, float* y, int ldy, bool first,
               const __mmask16* mask) {
  switch (R) {
    case 6: tile<6>(xf, ldxf, wb, kb, y, ldy, first, mask); break;
    case 5: tile<5>(xf, ldxf, wb, kb, y, ldy, first, mask); break;
    case 4: tile<4>(xf, ldxf, wb, kb, y, ldy, first, mask); break;
    case 3: tile<3>(xf, ldxf, wb, kb, y, ldy, first, mask); break;
    case 2: tile<2>(xf, ldxf, wb, kb, y, ldy, first, mask); break;
    default: tile<1>(xf, ldxf, wb, kb, y, ldy, first, mask); break;
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
  const T* src = w;  // the packed weights, read in order: spans, panels, rows
  for (int s0 = 0; s0 < K; s0 += kFmaKSpan) {
    const int s1 = imin(K, s0 + kFmaKSpan);
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      __mmask16 mask[4];
      for (int j = 0; j < 4; ++j) {
        const int c = imin(16, valid - 16 * j);
        mask[j] = c <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << c) - 1);
      }
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
          const int m0 = t * kMR;
          tile_rows(imin(kMR, M - m0), xf + int64_t(m0) * K + k0, K, wb, kb, yp + int64_t(m0) * ldy, ldy, k0 == 0,
                    mask);
        }
      }
    }
  }
}

}  // namespace

void fma_matmul_avx512(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                       float* scratch) {
  run(w, K, N, x, M, ldx, y, ldy, scratch);
}

void fma_matmul_s8_avx512(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                          float* scratch) {
  run(w, K, N, x, M, ldx, y, ldy, scratch);
}

}  // namespace alpamayo::cpu
