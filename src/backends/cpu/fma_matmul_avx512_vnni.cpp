// The AVX512-VNNI int8 kernel of fma_matmul.h, "avx512_vnni" (compiled with the AVX-512 flags, CMakeLists.txt;
// called only where isa() has AVX-512 and AVX512-VNNI). y[m][n] = sum_k (x[m][k] - 128) w[n][k], the exact int32
// sum (vpdpbusd on u8 x s8, minus 128 x the column sum of w kept at packing) rounded once to fp32.
//
// Layout (FmaWeights::pack_s8 for this kernel): panels of 64 columns, K in spans of kFmaKSpan rows as for the FMA
// kernels, but within a span-panel the rows go in quads, [ceil(ks/4)][64][4] bytes (zero-padded), the operand
// order vpdpbusd needs: one zmm holds 4 consecutive k of 16 columns. Per span, panel and block of kKB rows (a
// 16 KB slice of the packed weights, read in place from L1) a register tile of up to 6 rows x 64 columns runs:
// 24 int32 accumulators, 4 weight vectors and one broadcast dword of x per row and quad. Partial sums go back to
// y as int32 between blocks and become fp32 after the last.
//
// The weights are prefetched kAhead bytes ahead of the block in use, spread over the row tiles. Speed: on par with
// oneDNN's int8 matmul, hot and cold (one thread: ~80% of the vpdpbusd peak warm, ~70% cold), so the timed
// choice, which tries oneDNN first, keeps it (docs/CPU_BACKEND.md). What this kernel adds: exact int32 sums, and
// an int8 path of our own.
//
// Nothing here may instantiate an inline or template function with external linkage (scripts/check-isa-objects.sh).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/fma_matmul.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 64;   // columns per panel: 4 zmm of 16 int32 lanes
constexpr int kMR = 6;    // rows per register tile
constexpr int kKB = 256;  // rows of K per block: 64 quads x 256 bytes = 16 KB
static_assert(kFmaKSpan % kKB == 0, "K blocks must not straddle spans");
// Prefetch distance, into L1 (bench_matmul --fma, int8 rows, AMD EPYC Zen 5: of 64 KB to 2 MB ahead, into L1 or
// L2, 64 KB into L1 ran fastest, hot and cold).
constexpr int kAhead = 64 << 10;

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

__attribute__((always_inline)) inline int32_t load_dword(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc += the u8 x s8 dot products of 4-byte groups. In asm: GCC 12 expands _mm512_dpbusd_epi32 with a copy of
// the accumulator per call and spilled this tile's 24 of them (a third of the peak, bench_matmul --fma).
__attribute__((always_inline)) inline void dpbusd(__m512i& acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "vm"(s8));
}

// Rows [0, R) of the tile over quads [0, nq) of the block wb ([nq][64][4] s8); x points at the block's first k of
// row 0 (row stride ldx bytes). first: start from 0, else from the int32 partials in y. last: finish, writing fp32.
template <int R>
void tile(const uint8_t* x, int ldx, const int8_t* wb, int nq, float* y, int ldy, bool first, bool last,
          const __m512i* corr, const __mmask16* mask) {
  __m512i acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      acc[r][j] = first ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi32(mask[j], y + int64_t(r) * ldy + 16 * j);
  for (int q = 0; q < nq; ++q) {
    const int8_t* w = wb + q * 4 * kNR;
    const __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 64), w2 = _mm512_load_si512(w + 128),
                  w3 = _mm512_load_si512(w + 192);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(load_dword(x + int64_t(r) * ldx + 4 * q));
      dpbusd(acc[r][0], b, w0);
      dpbusd(acc[r][1], b, w1);
      dpbusd(acc[r][2], b, w2);
      dpbusd(acc[r][3], b, w3);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      float* dst = y + int64_t(r) * ldy + 16 * j;
      if (last)
        _mm512_mask_storeu_ps(dst, mask[j], _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], corr[j])));
      else
        _mm512_mask_storeu_epi32(dst, mask[j], acc[r][j]);
    }
}

void tile_rows(int R, const uint8_t* x, int ldx, const int8_t* wb, int nq, float* y, int ldy, bool first, bool last,
               const __m512i* corr, const __mmask16* mask) {
  switch (R) {
    case 6: tile<6>(x, ldx, wb, nq, y, ldy, first, last, corr, mask); break;
    case 5: tile<5>(x, ldx, wb, nq, y, ldy, first, last, corr, mask); break;
    case 4: tile<4>(x, ldx, wb, nq, y, ldy, first, last, corr, mask); break;
    case 3: tile<3>(x, ldx, wb, nq, y, ldy, first, last, corr, mask); break;
    case 2: tile<2>(x, ldx, wb, nq, y, ldy, first, last, corr, mask); break;
    default: tile<1>(x, ldx, wb, nq, y, ldy, first, last, corr, mask); break;
  }
}

}  // namespace

void fma_matmul_s8_avx512vnni(const int8_t* w, const int32_t* colsum, int K, int N, const uint8_t* x, int M, int ldx,
                              float* y, int ldy, uint8_t* scratch) {
  if (M <= 0 || N <= 0) return;
  const int Kq = (K + 3) / 4 * 4;
  if (Kq != K) {
    // The last quad reads past K: copy x into rows of Kq bytes (the padding meets zero weights).
    for (int m = 0; m < M; ++m) {
      std::memcpy(scratch + int64_t(m) * Kq, x + int64_t(m) * ldx, size_t(K));
      std::memset(scratch + int64_t(m) * Kq + K, 128, size_t(Kq - K));
    }
    x = scratch;
    ldx = Kq;
  }
  const int panels = (N + kNR - 1) / kNR, tiles = (M + kMR - 1) / kMR;
  constexpr int kLines = kKB * kNR / 64;  // cache lines of one full block
  const int per_tile = (kLines + tiles - 1) / tiles;
  const int8_t* src = w;  // the packed weights, read in order: spans, panels, blocks
  for (int s0 = 0; s0 < K; s0 += kFmaKSpan) {
    const int s1 = imin(K, s0 + kFmaKSpan);
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      __mmask16 mask[4];
      __m512i corr[4];
      for (int j = 0; j < 4; ++j) {
        const int c = imin(16, valid - 16 * j);
        mask[j] = c <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << c) - 1);
        corr[j] = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask[j], colsum + p * kNR + 16 * j), 7);
      }
      float* yp = y + int64_t(p) * kNR;
      for (int k0 = s0; k0 < s1; k0 += kKB) {
        const int nq = (imin(kKB, s1 - k0) + 3) / 4;
        const bool first = k0 == 0, last = k0 + kKB >= K;
        // The weights are read strictly sequentially; prefetching past their end is harmless.
        const char* next = reinterpret_cast<const char*>(src) + kAhead;
        for (int t = 0; t < tiles; ++t) {
          const int l0 = t * per_tile, l1 = imin(kLines, l0 + per_tile);
          for (int l = l0; l < l1; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
          const int m0 = t * kMR;
          tile_rows(imin(kMR, M - m0), x + int64_t(m0) * ldx + k0, ldx, src, nq, yp + int64_t(m0) * ldy, ldy, first,
                    last, corr, mask);
        }
        src += nq * 4 * kNR;
      }
    }
  }
}

}  // namespace alpamayo::cpu
