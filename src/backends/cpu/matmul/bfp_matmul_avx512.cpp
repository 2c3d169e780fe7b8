// The AVX512-BF16 block-format matmul (see bfp_matmul.h). An ISA file (AVX-512 flags, CMakeLists.txt): it
// defines no weak symbol and calls no inline function of a header (scripts/check-isa-objects.sh); callers
// check block_kernel_avx512_available() first.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backends/cpu/matmul/bfp_matmul.h"

#define ALP_BFP __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")))

namespace alpamayo::cpu {
namespace {

// Local min/max: std::min/std::clamp are inline templates (weak symbols if not inlined, e.g. at -O0).
inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

constexpr int kMaxRows = 6;  // rows of x per register tile (x 4 vectors of 16 columns: 24 accumulators)

// 16 block scales 2^(e - bias) from 16 shared exponents e (bias = 127 + W - 1: 133 for bfp8_b, 129 for bfp4_b),
// exact also where the scale is a denormal.
template <int Bias>
ALP_BFP inline void block_scales(const uint8_t* exps, float* out) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exps)));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(Bias - 127)), 23);
  const __mmask16 sub = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(Bias - 126));
  const __m512i den = _mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_add_epi32(e, _mm512_set1_epi32(149 - Bias)));
  _mm512_store_si512(out, _mm512_mask_blend_epi32(sub, normal, den));
}

// One bfp8_b block: sign-magnitude bytes (bit 7 sign, 7-bit magnitude) times the block scale.
ALP_BFP inline __m512 decode8(const uint8_t* mant, const float* scale) {
  const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mant)));
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(m, _mm512_set1_epi32(0x7f))),
                                 _mm512_set1_ps(*scale));
  // v | (m << 24 & sign bit)
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(v), _mm512_slli_epi32(m, 24),
                                                       _mm512_set1_epi32(int(0x80000000u)), 0xF8));
}

// Two bfp4_b blocks (16 bytes: value 2i in the low nibble of byte i, sign in bit 3) through a table of the 16
// codes' values (+-0..7), times the block scales.
ALP_BFP inline void decode4x2(const uint8_t* mant, const float* scale, __m512 lut, __m512& a, __m512& b) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mant));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
  a = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), lut), _mm512_set1_ps(scale[0]));
  b = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), lut), _mm512_set1_ps(scale[1]));
}

// Rows k (even) and k + 1 of 16 columns as bf16 pairs (exact: at most 8 significant bits).
ALP_BFP inline void store_pairs(uint32_t* dst, __m512 even, __m512 odd, __m512i interleave) {
  const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(odd, even);  // words 0-15 even, 16-31 odd
  _mm512_store_si512(dst, _mm512_permutexvar_epi16(interleave, w));
}

// Decodes tile rows [tr0, tr0 + ntr) of panel p into wb[kp][ldw] bf16 pairs (ldw = 32 * tiles).
template <BlockStore S>
ALP_BFP void decode_panel(const uint8_t* base, int tiles, int tr0, int ntr, uint32_t* wb) {
  constexpr bfp::Format F = S == BlockStore::BFP8_B ? bfp::Format::Bfp8_b : bfp::Format::Bfp4_b;
  constexpr size_t TB = bfp::tile_bytes(F), BB = bfp::block_bytes(F);
  constexpr int Bias = S == BlockStore::BFP8_B ? 133 : 129;
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const __m512 lut = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, -0.f, -1.f, -2.f, -3.f, -4.f, -5.f, -6.f, -7.f);
  const int ldw = tiles * 32;
  alignas(64) float sc[16];
  for (int tr = tr0; tr < tr0 + ntr; ++tr)
    for (int j = 0; j < tiles; ++j) {
      const uint8_t* tile = base + (size_t(tr) * tiles + j) * TB;
      for (int f = 0; f < 4; ++f) {
        block_scales<Bias>(tile + f * 16, sc);
        const uint8_t* mant = tile + bfp::kBlocksPerTile + size_t(f) * 16 * BB;
        // Face f: rows (f / 2) * 16 .. + 16 of the tile, columns j * 32 + (f % 2) * 16 .. + 16.
        uint32_t* dst = wb + size_t((tr - tr0) * 16 + (f / 2) * 8) * ldw + j * 32 + (f % 2) * 16;
#pragma GCC unroll 8
        for (int pr = 0; pr < 8; ++pr) {
          __m512 a, b;
          if constexpr (S == BlockStore::BFP8_B) {
            a = decode8(mant + (2 * pr) * BB, sc + 2 * pr);
            b = decode8(mant + (2 * pr + 1) * BB, sc + 2 * pr + 1);
          } else {
            decode4x2(mant + (2 * pr) * BB, sc + 2 * pr, lut, a, b);
          }
          store_pairs(dst + size_t(pr) * ldw, a, b, interleave);
        }
      }
    }
}

inline uint32_t load_u32(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// y[R rows][C*16 columns (nc valid)] (+)= x[R][0..kv) * wb[kv/2 pairs][C*16]; x rows at stride ldx.
template <int R, int C>
ALP_BFP void micro(const uint32_t* wb, int ldw, const uint16_t* x, int ldx, int kv, float* y, int ldy, bool accumulate,
                   int nc) {
  __mmask16 mk[C];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    const int valid = imin(imax(nc - 16 * c, 0), 16);
    mk[c] = static_cast<__mmask16>((1u << valid) - 1u);
  }
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      acc[r][c] = accumulate ? _mm512_maskz_loadu_ps(mk[c], y + size_t(r) * ldy + 16 * c) : _mm512_setzero_ps();
  const int np = kv / 2;
  for (int kp = 0; kp < np; ++kp) {
    __m512bh w[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) w[c] = (__m512bh)(_mm512_load_si512(wb + size_t(kp) * ldw + 16 * c));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xb = (__m512bh)(_mm512_set1_epi32(int(load_u32(x + size_t(r) * ldx + 2 * kp))));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], w[c], xb);
    }
  }
  if (kv & 1) {  // odd K: the last value alone (its pair partner in wb is zero padding; x's is not read)
    __m512bh w[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) w[c] = (__m512bh)(_mm512_load_si512(wb + size_t(np) * ldw + 16 * c));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xb = (__m512bh)(_mm512_set1_epi32(int(x[size_t(r) * ldx + 2 * np])));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], w[c], xb);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + size_t(r) * ldy + 16 * c, mk[c], acc[r][c]);
}

template <int C>
ALP_BFP void rows(const uint32_t* wb, int ldw, const uint16_t* x, int M, int ldx, int kv, float* y, int ldy,
                  bool accumulate, int nc) {
  int m = 0;
  for (; m + kMaxRows <= M; m += kMaxRows)
    micro<kMaxRows, C>(wb, ldw, x + size_t(m) * ldx, ldx, kv, y + size_t(m) * ldy, ldy, accumulate, nc);
  const uint16_t* xr = x + size_t(m) * ldx;
  float* yr = y + size_t(m) * ldy;
  switch (M - m) {
    case 1: micro<1, C>(wb, ldw, xr, ldx, kv, yr, ldy, accumulate, nc); break;
    case 2: micro<2, C>(wb, ldw, xr, ldx, kv, yr, ldy, accumulate, nc); break;
    case 3: micro<3, C>(wb, ldw, xr, ldx, kv, yr, ldy, accumulate, nc); break;
    case 4: micro<4, C>(wb, ldw, xr, ldx, kv, yr, ldy, accumulate, nc); break;
    case 5: micro<5, C>(wb, ldw, xr, ldx, kv, yr, ldy, accumulate, nc); break;
    default: break;
  }
}

}  // namespace

ALP_BFP void block_matmul_avx512(const BlockPart& w, const uint16_t* x, int M, int ldx, float* y, int ldy,
                                 void* scratch) {
  uint32_t* wbuf = static_cast<uint32_t*>(scratch);
  const int K = w.K, n = w.N, TR = w.tile_rows;
  constexpr int panel = kPanel, kb = kKBlock / 32;  // by value: no odr-use of the header's inline variables
  for (int p = 0; p * panel < n; ++p) {
    const int c0 = p * panel, nc = imin(panel, n - c0), tiles = nc > 32 ? 2 : 1, ldw = 32 * tiles;
    const uint8_t* base = w.data + size_t(p) * w.panel_bytes;
    for (int tr0 = 0; tr0 < TR; tr0 += kb) {
      const int ntr = imin(kb, TR - tr0), k0 = tr0 * 32, kv = imin(K - k0, ntr * 32);
      const uint32_t* wb;
      switch (w.store) {
        case BlockStore::BF16: wb = reinterpret_cast<const uint32_t*>(base) + size_t(k0 / 2) * ldw; break;
        case BlockStore::BFP8_B: decode_panel<BlockStore::BFP8_B>(base, tiles, tr0, ntr, wbuf); wb = wbuf; break;
        default: decode_panel<BlockStore::BFP4_B>(base, tiles, tr0, ntr, wbuf); wb = wbuf; break;
      }
      if (tiles == 2)
        rows<4>(wb, ldw, x + k0, M, ldx, kv, y + c0, ldy, k0 > 0, nc);
      else
        rows<2>(wb, ldw, x + k0, M, ldx, kv, y + c0, ldy, k0 > 0, nc);
    }
  }
}

}  // namespace alpamayo::cpu
