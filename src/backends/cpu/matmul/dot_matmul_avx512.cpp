// The dot-product kernels of matmul_kernels.h (compiled with the AVX-512 flags, CMakeLists.txt; each called only where
// isa() allows it): "avx512_vnni" for int8 weights (vpdpbusd: u8 x s8 in groups of 4 k, summed in int32, minus 128
// x the column sum of w kept at packing, rounded once to fp32: the exact sum) and "avx512_bf16" for bf16 weights
// (vdpbf16ps: bf16 x bf16 in groups of 2 k, summed in fp32).
//
// Layout (MatmulWeights::pack* for these kernels): panels of 64 columns, K in spans of kDotKSpan rows (kFmaKSpan for
// the FMA kernels), and within a span-panel the rows go in groups of G = 4 (int8) or 2 (bf16) k, [ceil(ks/G)][64][G]
// elements zero-padded: one zmm holds a group of 16 columns, the operand order of the dot instructions. Per span,
// panel and block of 256 groups (a 64 KB slice of the packed weights, read in place: the first row tile brings
// it from DRAM, the others read it from L2) a register tile of up to 6 rows x 64 columns runs: 24 accumulators,
// 4 weight vectors and one broadcast dword of x (a group of one row) per row and group. Partial sums go back to y
// between blocks (int32 or fp32) and become fp32 after the last: 16 KB blocks (L1-resident) lost several points
// of the peak in those round trips of y. The weights are prefetched kAhead bytes ahead of the block in use, spread
// over the row tiles and within a tile one line per group: issued in one burst per tile, the prefetches filled the
// miss buffers and stalled the tile's own loads. Both measured: docs/PERFORMANCE.md, "Measurements behind design
// choices".
//
// Nothing here may instantiate an inline or template function with external linkage (scripts/check-isa-objects.sh).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 64;      // columns per panel: 4 zmm of 16 lanes
constexpr int kMR = 6;       // rows per register tile
constexpr int kGroups = 256;  // k-groups per block: 256 x 256 bytes = 64 KB (a whole int8 span)
static_assert(kDotKSpan % (4 * kGroups) == 0, "K blocks must not straddle spans");
// Prefetch distance, into L1: one 64 KB block ahead, the fastest of the distances and levels tried
// (docs/PERFORMANCE.md, "Measurements behind design choices").
constexpr int kAhead = 64 << 10;

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }
__attribute__((always_inline)) inline int imax(int a, int b) { return a > b ? a : b; }

__attribute__((always_inline)) inline int32_t load_dword(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The two instruction sets' operations on one accumulator. In asm: GCC 12 expands _mm512_dpbusd_epi32 (and
// _mm512_dpbf16_ps) with a copy of the accumulator per call and spilled this tile's 24 of them (a third of the
// peak, bench_matmul --fma).
struct Int8Dot {
  using Acc = __m512i;
  using W = int8_t;
  using X = uint8_t;
  static constexpr int kGroup = 4;
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc load(__mmask16 m, const float* y) { return _mm512_maskz_loadu_epi32(m, y); }
  static void dot(Acc& acc, __m512i x, __m512i w) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "vm"(w)); }
  static void store_partial(float* y, __mmask16 m, Acc acc) { _mm512_mask_storeu_epi32(y, m, acc); }
  static void store_final(float* y, __mmask16 m, Acc acc, __m512i corr) {
    _mm512_mask_storeu_ps(y, m, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, corr)));
  }
};

struct Bf16Dot {
  using Acc = __m512;
  using W = uint16_t;
  using X = uint16_t;
  static constexpr int kGroup = 2;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc load(__mmask16 m, const float* y) { return _mm512_maskz_loadu_ps(m, y); }
  static void dot(Acc& acc, __m512i x, __m512i w) { asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(x), "vm"(w)); }
  static void store_partial(float* y, __mmask16 m, Acc acc) { _mm512_mask_storeu_ps(y, m, acc); }
  static void store_final(float* y, __mmask16 m, Acc acc, __m512i) { _mm512_mask_storeu_ps(y, m, acc); }
};

// Rows [0, R) of the tile over groups [0, ng) of the block wb ([ng][64][G] elements); x points at the block's
// first k of row 0 (row stride ldx elements). first: start from 0, else from the partials in y. last: finish.
template <class Dot, int R>
void tile(const typename Dot::X* x, int ldx, const typename Dot::W* wb, int ng, float* y, int ldy, bool first,
          bool last, const __m512i* corr, const __mmask16* mask, const char* pf, int npf) {
  typename Dot::Acc acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = first ? Dot::zero() : Dot::load(mask[j], y + int64_t(r) * ldy + 16 * j);
  const int npf_in = imin(npf, ng);
  for (int q = 0; q < ng; ++q) {
    if (q < npf_in) _mm_prefetch(pf + 64 * q, _MM_HINT_T0);
    const auto* w = reinterpret_cast<const char*>(wb) + q * 4 * 64;
    const __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 64), w2 = _mm512_load_si512(w + 128),
                  w3 = _mm512_load_si512(w + 192);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(load_dword(x + int64_t(r) * ldx + Dot::kGroup * q));
      Dot::dot(acc[r][0], b, w0);
      Dot::dot(acc[r][1], b, w1);
      Dot::dot(acc[r][2], b, w2);
      Dot::dot(acc[r][3], b, w3);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      float* dst = y + int64_t(r) * ldy + 16 * j;
      if (last)
        Dot::store_final(dst, mask[j], acc[r][j], corr[j]);
      else
        Dot::store_partial(dst, mask[j], acc[r][j]);
    }
  for (int l = npf_in; l < npf; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);  // more lines than groups: few rows
}

template <class Dot>
void tile_rows(int R, const typename Dot::X* x, int ldx, const typename Dot::W* wb, int ng, float* y, int ldy,
               bool first, bool last, const __m512i* corr, const __mmask16* mask, const char* pf, int npf) {
  switch (R) {
    case 6: tile<Dot, 6>(x, ldx, wb, ng, y, ldy, first, last, corr, mask, pf, npf); break;
    case 5: tile<Dot, 5>(x, ldx, wb, ng, y, ldy, first, last, corr, mask, pf, npf); break;
    case 4: tile<Dot, 4>(x, ldx, wb, ng, y, ldy, first, last, corr, mask, pf, npf); break;
    case 3: tile<Dot, 3>(x, ldx, wb, ng, y, ldy, first, last, corr, mask, pf, npf); break;
    case 2: tile<Dot, 2>(x, ldx, wb, ng, y, ldy, first, last, corr, mask, pf, npf); break;
    default: tile<Dot, 1>(x, ldx, wb, ng, y, ldy, first, last, corr, mask, pf, npf); break;
  }
}

// colsum: int8 only (nullptr for bf16). scratch: x copied to rows of K rounded up to the group when K is not a
// multiple of it (the padding meets zero weights).
template <class Dot>
void run(const typename Dot::W* w, const int32_t* colsum, int K, int N, const typename Dot::X* x, int M, int ldx,
         float* y, int ldy, void* scratch, bool x_ready) {
  using X = typename Dot::X;
  constexpr int G = Dot::kGroup, kKB = kGroups * G;
  if (M <= 0 || N <= 0) return;
  const int Kg = (K + G - 1) / G * G;
  if (Kg != K) {
    auto* xs = static_cast<X*>(scratch);
    for (int m = 0; m < M && !x_ready; ++m) {
      std::memcpy(xs + int64_t(m) * Kg, x + int64_t(m) * ldx, sizeof(X) * K);
      std::memset(xs + int64_t(m) * Kg + K, 0, sizeof(X) * (Kg - K));
    }
    x = xs;
    ldx = Kg;
  }
  const int panels = (N + kNR - 1) / kNR, tiles = (M + kMR - 1) / kMR;
  constexpr int kLines = kGroups * 4;  // cache lines of one full block (16 KB)
  const int per_tile = (kLines + tiles - 1) / tiles;
  const auto* src = reinterpret_cast<const char*>(w);  // the packed weights, in order: spans, panels, blocks
  for (int s0 = 0; s0 < K; s0 += kDotKSpan) {
    const int s1 = imin(K, s0 + kDotKSpan);
    for (int p = 0; p < panels; ++p) {
      const int valid = imin(kNR, N - p * kNR);
      __mmask16 mask[4];
      __m512i corr[4];
      for (int j = 0; j < 4; ++j) {
        const int c = imin(16, valid - 16 * j);
        mask[j] = c <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << c) - 1);
        corr[j] = colsum ? _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask[j], colsum + p * kNR + 16 * j), 7)
                         : _mm512_setzero_si512();
      }
      float* yp = y + int64_t(p) * kNR;
      for (int k0 = s0; k0 < s1; k0 += kKB) {
        const int ng = (imin(kKB, s1 - k0) + G - 1) / G;
        const bool first = k0 == 0, last = k0 + kKB >= K;
        // The weights are read strictly sequentially; prefetching past their end is harmless.
        const char* next = src + kAhead;
        for (int t = 0; t < tiles; ++t) {
          const int l0 = t * per_tile, l1 = imin(kLines, l0 + per_tile);
          const int m0 = t * kMR;
          tile_rows<Dot>(imin(kMR, M - m0), x + int64_t(m0) * ldx + k0, ldx,
                         reinterpret_cast<const typename Dot::W*>(src), ng, yp + int64_t(m0) * ldy, ldy, first, last,
                         corr, mask, next + 64 * l0, imax(0, l1 - l0));
        }
        src += ng * 4 * kNR;
      }
    }
  }
}

}  // namespace

void fma_matmul_s8_avx512vnni(const int8_t* w, const int32_t* colsum, int K, int N, const uint8_t* x, int M, int ldx,
                              float* y, int ldy, uint8_t* scratch, bool x_ready) {
  run<Int8Dot>(w, colsum, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

void dot_matmul_avx512bf16(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                           void* scratch, bool x_ready) {
  run<Bf16Dot>(w, nullptr, K, N, x, M, ldx, y, ldy, scratch, x_ready);
}

}  // namespace alpamayo::cpu
