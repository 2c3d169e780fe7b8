// The int8 dot-product kernel of matmul_kernels.h for CPUs without VNNI, "avx2_int8" (compiled with the AVX2 baseline
// flags, CMakeLists.txt; called only where isa().has(kAvx2Fma)). The exact int32 sum of q_x * w, rounded once to
// fp32: the same bits as avx512_vnni.
//
// Why vpmaddwd on int16 and not vpmaddubsw on the bytes: vpmaddubsw saturates its int16 pair sums, so an exact
// kernel must feed it |q| and w with q's sign (vpsignb): four vector instructions per 32 multiply-adds (vpsignb,
// vpmaddubsw, vpmaddwd, vpaddd), slower than this kernel's loop on L1-resident data (docs/CPU_BACKEND.md,
// docs/PERFORMANCE.md). vpmaddwd multiplies int16 pairs into int32 without saturation
// (|q|, |w| <= 128): two instructions per 16 multiply-adds, nothing to fix up, and weights of -128 need no
// exclusion.
//
// Layout (MatmulWeights::pack_s8 for this kernel): panels of 16 columns, K in spans of kFmaKSpan rows, and within a
// span-panel the rows go in pairs of k, [ceil(ks/2)][16][2] bytes zero-padded. x is copied once per call to int16
// q = u8 - 128, rows of K rounded up to the pair. Per span and panel, block by block of kKB rows: the block's first
// register tile (up to 6 rows x 16 columns: 12 int32 accumulators, 2 weight vectors, one broadcast pair of q) widens
// the weights to int16 in registers and leaves them in an L1 block for the other tiles, as fma_matmul_avx2.cpp does
// with fp32. The panel's int32 partial sums stay in a dense buffer between blocks, go to y as int32 between spans,
// and as fp32 after the last. The weights are prefetched into L2 256 KB ahead and the next block into L1.
//
// Nothing here may instantiate an inline or template function with external linkage (scripts/check-isa-objects.sh).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 16;   // columns per panel: 2 ymm of 8 columns x a pair of k
constexpr int kMR = 6;    // rows per register tile
constexpr int kKB = kAvx2Int8KBlock;  // rows of K per widened block: 256 pairs x 16 columns x 2 x int16 = 16 KB
static_assert(kFmaKSpan % kKB == 0 && kKB % 2 == 0, "K blocks must not straddle spans or pairs");
constexpr int kAhead = 256 << 10;  // L2 prefetch distance (fma_matmul_avx2.cpp)

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

// Row m of x (u8 = q + 128) as int16 q in rows of Kp >= K, the padding zero.
void prepare(const uint8_t* x, int M, int ldx, int K, int Kp, int16_t* q) {
  const __m256i bias = _mm256_set1_epi16(128);
  for (int m = 0; m < M; ++m) {
    const uint8_t* src = x + int64_t(m) * ldx;
    int16_t* dst = q + int64_t(m) * Kp;
    int k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), _mm256_sub_epi16(u, bias));
    }
    for (; k < K; ++k) dst[k] = static_cast<int16_t>(int(src[k]) - 128);
    for (; k < Kp; ++k) dst[k] = 0;
  }
}

// acc0 += vpmaddwd(broadcast pair at xp, w0), acc1 likewise with w1. In asm with two fixed temporaries: from the
// intrinsics GCC kept each sum in a temporary and copied it back, and with 6 rows spilled accumulators to the
// stack (16 ymm: 12 accumulators, 2 weights, the broadcast and one product). 6 x 16 without spills runs the seed's
// slices faster than the 4 x 16 tile (docs/PERFORMANCE.md, "Measurements behind design choices").
__attribute__((always_inline)) inline void row_pair(const int16_t* xp, __m256i w0, __m256i w1, __m256i& acc0,
                                                    __m256i& acc1) {
  asm("vpbroadcastd %[xm], %%ymm15\n\t"
      "vpmaddwd %[w0], %%ymm15, %%ymm14\n\t"
      "vpaddd %%ymm14, %[a0], %[a0]\n\t"
      "vpmaddwd %[w1], %%ymm15, %%ymm14\n\t"
      "vpaddd %%ymm14, %[a1], %[a1]"
      : [a0] "+x"(acc0), [a1] "+x"(acc1)
      : [w0] "x"(w0), [w1] "x"(w1), [xm] "m"(*reinterpret_cast<const int32_t*>(xp))
      : "xmm14", "xmm15");
}

// Rows [0, R) of a tile over np pairs of k of one block: x's row r at x + r * ld (int16, the block's first k),
// partial sums in yb ([R][16] int32, dense), starting at 0 (first) or at yb's. kWiden: this tile widens the packed
// pairs src ([np][16][2] s8) itself and leaves them in wb ([np][16][2] int16) for the block's other tiles.
template <int R, bool kWiden>
void tile(const int16_t* x, int64_t ld, const int8_t* src, int16_t* wb, int np, int32_t* yb, bool first) {
  __m256i acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j)
      acc[r][j] = first ? _mm256_setzero_si256() : _mm256_load_si256(reinterpret_cast<const __m256i*>(yb + r * kNR + 8 * j));
  for (int p = 0; p < np; ++p) {
    __m256i w0, w1;
    auto* wp = reinterpret_cast<__m256i*>(wb + 32 * p);
    if constexpr (kWiden) {
      w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32 * p)));
      w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32 * p + 16)));
      _mm256_store_si256(wp, w0);
      _mm256_store_si256(wp + 1, w1);
    } else {
      w0 = _mm256_load_si256(wp);
      w1 = _mm256_load_si256(wp + 1);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) row_pair(x + r * ld + 2 * p, w0, w1, acc[r][0], acc[r][1]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(yb + r * kNR + 8 * j), acc[r][j]);
}

template <bool kWiden>
void tile_rows(int R, const int16_t* x, int64_t ld, const int8_t* src, int16_t* wb, int np, int32_t* yb, bool first) {
  switch (R) {
    case 6: tile<6, kWiden>(x, ld, src, wb, np, yb, first); break;
    case 5: tile<5, kWiden>(x, ld, src, wb, np, yb, first); break;
    case 4: tile<4, kWiden>(x, ld, src, wb, np, yb, first); break;
    case 3: tile<3, kWiden>(x, ld, src, wb, np, yb, first); break;
    case 2: tile<2, kWiden>(x, ld, src, wb, np, yb, first); break;
    default: tile<1, kWiden>(x, ld, src, wb, np, yb, first); break;
  }
}

}  // namespace

void dot_matmul_s8_avx2(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                        uint8_t* scratch, bool x_ready) {
  if (M <= 0 || N <= 0) return;
  const int Kp = (K + 1) / 2 * 2;
  auto* q = reinterpret_cast<int16_t*>(scratch);
  auto* wb = reinterpret_cast<int16_t*>(scratch + (int64_t(M) * Kp * 2 + 63) / 64 * 64);  // 64-byte aligned
  auto* yb = reinterpret_cast<int32_t*>(wb + kKB * kNR);                                  // [M][16]
  if (!x_ready) prepare(x, M, ldx, K, Kp, q);
  const int panels = (N + kNR - 1) / kNR, tiles = (M + kMR - 1) / kMR;
  constexpr int kLines = kKB * kNR / 64;  // cache lines of one packed block
  const int per_tile = (kLines + tiles - 1) / tiles;
  const int8_t* src = w;  // the packed weights, read in order: spans, panels, pairs
  for (int s0 = 0; s0 < K; s0 += kFmaKSpan) {
    const int s1 = imin(K, s0 + kFmaKSpan);
    const bool last = s1 == K;
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      float* yp = y + int64_t(p) * kNR;
      // Partial int32 sums of earlier spans come back from y (stored there as int32 bits).
      if (s0 > 0)
        for (int m = 0; m < M; ++m)
          for (int c = 0; c < kNR; ++c) {
            int32_t v = 0;
            if (c < valid) std::memcpy(&v, yp + int64_t(m) * ldy + c, 4);
            yb[m * kNR + c] = v;
          }
      for (int k0 = s0; k0 < s1; k0 += kKB) {
        const int np = (imin(kKB, s1 - k0) + 1) / 2;
        const int8_t* blk = src;
        src += np * 2 * kNR;
        const char* next = reinterpret_cast<const char*>(src) + kAhead;  // past the end is harmless
        for (int t = 0; t < tiles; ++t) {
          const int l0 = t * per_tile, l1 = imin(kLines, l0 + per_tile);
          for (int l = l0; l < l1; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
          for (int l = l0; l < l1; ++l) _mm_prefetch(reinterpret_cast<const char*>(src) + 64 * l, _MM_HINT_T0);
          const int m0 = t * kMR, R = imin(kMR, M - m0);
          const int16_t* xt = q + int64_t(m0) * Kp + k0;
          const bool first = s0 == 0 && k0 == 0;
          if (t == 0) tile_rows<true>(R, xt, Kp, blk, wb, np, yb + m0 * kNR, first);
          else tile_rows<false>(R, xt, Kp, blk, wb, np, yb + m0 * kNR, first);
        }
      }
      for (int m = 0; m < M; ++m) {
        const int32_t* from = yb + m * kNR;
        float* to = yp + int64_t(m) * ldy;
        if (last) {
          if (valid == kNR) {
            const __m256i* f = reinterpret_cast<const __m256i*>(from);
            _mm256_storeu_ps(to, _mm256_cvtepi32_ps(_mm256_load_si256(f)));
            _mm256_storeu_ps(to + 8, _mm256_cvtepi32_ps(_mm256_load_si256(f + 1)));
          } else {
            for (int c = 0; c < valid; ++c) to[c] = static_cast<float>(from[c]);
          }
        } else {
          std::memcpy(to, from, size_t(valid) * 4);
        }
      }
    }
  }
}

}  // namespace alpamayo::cpu
