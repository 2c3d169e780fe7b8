// The AVX-512F kernel of matmul_kernels.h (compiled with AVX-512 flags, CMakeLists.txt; called only where
// isa().has(kAvx512)). Panels of 64 columns; per span, panel and block of kKB rows of K the bf16 (or s8) weights
// are multiplied with every row of x by a register tile of up to 6 rows x 64 columns: 24 zmm accumulators, 4
// weight vectors per k, one broadcast per row. The block's first tile reads the packed weights, widens them in
// registers and leaves them, fp32, in a 16 KB block that the other tiles read (a separate widening pass stalled
// on the weights' loads, with the weights streamed from memory as in a step).
// Accumulators start at 0; between the blocks of a span they go through a contiguous panel buffer (yb, [M][64])
// and reach y only at the span's ends, so each output element is the single fp32 FMA chain over k = 0..K-1
// (matmul_kernels.h). x is widened once per call, block by block, so that a row tile's rows of a block are one
// contiguous stretch. The weights are prefetched into L2 256 KB ahead of the block in use and the next block into
// L1, spread over the row tiles.
//
// Why the panel buffer and the block-wise x (measured: docs/PERFORMANCE.md, "Measurements behind design
// choices"): the partial sums had gone back to y itself every 64 rows of K,
// and y's rows lie N floats apart, often a multiple of 4 KB, so a panel's 64 rows fell into the same few L1 sets
// and came back from L2 at the start of every tile; x's rows, K floats apart, did the same in fewer sets.
//
// Nothing here may instantiate an inline or template function with external linkage (std::min, containers):
// the linker could keep this AVX-512 copy for every other translation unit. Everything is in an anonymous
// namespace or a plain loop; `nm -C` of the object shows no weak symbols.
// GCC 12's avx512fintrin.h leaves the pass-through operand of _mm512_cvtepu16_epi32 / _mm512_slli_epi32
// undefined on purpose, and -Wmaybe-uninitialized (or -Wuninitialized) reports it once inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 64;  // columns per panel: 4 zmm
constexpr int kMR = 6;   // rows per register tile
// Rows of K per widened block: 64 x 64 fp32 = 16 KB, which with x's rows of the block and the next block's prefetch
// fits a 32-48 KB L1, so the other row tiles read it from L1 (measured against 128 rows: docs/PERFORMANCE.md, "The
// bars of a machine without AMX").
constexpr int kKB = 64;
static_assert(kKB * kNR <= kFmaKBlock * 64, "the widened block must fit matmul_scratch_bytes()");
static_assert(kFmaKSpan % kKB == 0, "K blocks must not straddle spans");

// Weights are prefetched into L2 this far ahead of the block being widened: one block ahead left cold weights
// far below their hot speed (docs/PERFORMANCE.md, "Measurements behind design choices").
constexpr int kAhead = 256 << 10;

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

__attribute__((always_inline)) inline __m512 widen16(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// 16 (or the masked first ones) activations widened to fp32: bf16 exactly, int8 (u8 = q + 128) as q.
__attribute__((always_inline)) inline __m512 widen_x16(const uint16_t* src, __mmask16 m) {
  return widen16(_mm256_maskz_loadu_epi16(m, src));
}
__attribute__((always_inline)) inline __m512 widen_x16(const uint8_t* src, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, src)), _mm512_set1_epi32(128)));
}

// x widened to fp32 block by block: block b (rows k0 = b * kKB .. k0 + kb of K) holds [M][kb] at xf + k0 * M, so a
// row tile reads its rows of a block from one contiguous stretch.
template <class X>
void widen_x(const X* x, int M, int ldx, int K, float* xf) {
  for (int k0 = 0; k0 < K; k0 += kKB) {
    const int kb = imin(kKB, K - k0);
    float* dst = xf + int64_t(k0) * M;
    for (int m = 0; m < M; ++m, dst += kb) {
      const X* src = x + int64_t(m) * ldx + k0;
      for (int k = 0; k < kb; k += 16) {
        const int c = imin(16, kb - k);
        const __mmask16 mask = static_cast<__mmask16>((1u << c) - 1);
        _mm512_mask_storeu_ps(dst + k, mask, widen_x16(src + k, mask));
      }
    }
  }
}

// One packed row of 64 weights widened to fp32 (exact), columns 16j..16j+15 in w[j]. bf16 rows hold columns c and
// c + 16 of each half in one 32-bit word (matmul_packed_slot): the low half shifted up and the high half masked are
// the two zmm, two operations per 32 weights.
__attribute__((always_inline)) inline void widen_row64(const uint16_t* src, __m512* w) {
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  const __m512i a = _mm512_loadu_si512(src), b = _mm512_loadu_si512(src + 32);
  w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
  w[1] = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
  w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  w[3] = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
}
__attribute__((always_inline)) inline void widen_row64(const int8_t* src, __m512* w) {
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)
    w[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * j))));
}

// Rows [0, R) of a register tile over the block's kb rows: the sums start at 0 (yin == nullptr) or at yin's
// (row stride ldin) and go to yout (row stride ldout), columns masked by mask[j]. kWiden: the block's first tile
// reads the packed weights src ([kb][64] of T) itself, widens them in registers and leaves them in wb for the
// other tiles; its loads from memory are then spread over its FMAs instead of stalling a separate pass.
template <int R, bool kWiden, class T>
void tile(const float* xf, int ldxf, const T* src, float* wb, int kb, const float* yin, int ldin, float* yout,
          int ldout, const __mmask16* mask) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      acc[r][j] = yin ? _mm512_maskz_loadu_ps(mask[j], yin + int64_t(r) * ldin + 16 * j) : _mm512_setzero_ps();
  for (int k = 0; k < kb; ++k) {
    float* wk = wb + k * kNR;
    __m512 w[4];
    if constexpr (kWiden) widen_row64(src + k * kNR, w);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      if constexpr (kWiden) _mm512_store_ps(wk + 16 * j, w[j]);
      else w[j] = _mm512_load_ps(wk + 16 * j);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(xf[int64_t(r) * ldxf + k]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(b, w[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(yout + int64_t(r) * ldout + 16 * j, mask[j], acc[r][j]);
}

template <bool kWiden, class T>
void tile_rows(int R, const float* xf, int ldxf, const T* src, float* wb, int kb, const float* yin, int ldin,
               float* yout, int ldout, const __mmask16* mask) {
  switch (R) {
    case 6: tile<6, kWiden>(xf, ldxf, src, wb, kb, yin, ldin, yout, ldout, mask); break;
    case 5: tile<5, kWiden>(xf, ldxf, src, wb, kb, yin, ldin, yout, ldout, mask); break;
    case 4: tile<4, kWiden>(xf, ldxf, src, wb, kb, yin, ldin, yout, ldout, mask); break;
    case 3: tile<3, kWiden>(xf, ldxf, src, wb, kb, yin, ldin, yout, ldout, mask); break;
    case 2: tile<2, kWiden>(xf, ldxf, src, wb, kb, yin, ldin, yout, ldout, mask); break;
    default: tile<1, kWiden>(xf, ldxf, src, wb, kb, yin, ldin, yout, ldout, mask); break;
  }
}

// T: the weights' element (bf16 bits or s8), X: the activations' (bf16 bits or u8 = q + 128).
template <class T, class X>
void run(const T* w, int K, int N, const X* x, int M, int ldx, float* y, int ldy, float* scratch, bool x_ready) {
  if (M <= 0 || N <= 0) return;
  float* xf = scratch;
  float* wb = scratch + (int64_t(M) * K + 15) / 16 * 16;  // 64-byte aligned (scratch is)
  float* yb = wb + kFmaKBlock * 64;                           // [M][64]: one panel's partial sums
  if (!x_ready) widen_x(x, M, ldx, K, xf);
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
        const bool last = k0 + kb == s1;
        const T* blk = src;
        src += kb * kNR;
        // The weights are read strictly sequentially; prefetching past their end is harmless.
        const char* next = reinterpret_cast<const char*>(src) + kAhead;
        for (int t = 0; t < tiles; ++t) {
          const int l0 = t * per_tile, l1 = imin(kLines, l0 + per_tile);
          for (int l = l0; l < l1; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
          for (int l = l0; l < l1; ++l) _mm_prefetch(reinterpret_cast<const char*>(src) + 64 * l, _MM_HINT_T0);
          const int m0 = t * kMR;
          // Between blocks of a span the sums stay in yb; they come from y (if an earlier span left some) and go
          // back to it only at the span's ends.
          const float* yin = k0 == 0 ? nullptr : k0 == s0 ? yp + int64_t(m0) * ldy : yb + m0 * kNR;
          const int ldin = k0 == s0 ? ldy : kNR;
          float* yout = last ? yp + int64_t(m0) * ldy : yb + m0 * kNR;
          const float* xt = xf + int64_t(k0) * M + int64_t(m0) * kb;
          const int R = imin(kMR, M - m0), ldout = last ? ldy : kNR;
          if (t == 0) tile_rows<true>(R, xt, kb, blk, wb, kb, yin, ldin, yout, ldout, mask);
          else tile_rows<false>(R, xt, kb, blk, wb, kb, yin, ldin, yout, ldout, mask);
        }
      }
    }
  }
}

}  // namespace

void fma_matmul_avx512(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                       float* scratch, bool x_ready) {
  run(w, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

void fma_matmul_s8_avx512(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                          float* scratch, bool x_ready) {
  run(w, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

}  // namespace alpamayo::cpu
