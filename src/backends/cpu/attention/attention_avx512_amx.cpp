// The AMX attention kernel (amx_bf16; attention.h): both products of a key block on tiles (tdpbf16ps, bf16 pairs,
// fp32 accumulators), the online softmax between them in AVX-512. An ISA translation unit (compiled with the
// AVX-512 flags, CMakeLists.txt; the tile instructions are inline asm): it defines no weak symbol and calls no
// inline function of a header (scripts/check-isa-objects.sh); callers check attn_kernel_unavailable() first, which
// needs the OS's grant of the tile state (isa.cpp).
//
// Per chunk the queries are packed row-major (the A operand of S = Q.K^T: 16 rows x 32 dims a tile). Per block of
// up to kAmxKeyBlock keys: the keys are transposed into pairs per 16 keys (the B operand, VNNI layout; an int8 cache's
// rows as their integers, exact in bf16, the scales applied to the scores and probabilities), the values into pairs
// per 2 keys (the B operand of P.V); per group of 32 query rows S (2 x 2 tiles of 16 x 16), then those rows' exact
// online-softmax update (row maxima, base 2, fp32, m only rises), the probabilities rounded to bf16 row-major (the A
// operand of P.V), O rescaled in memory for the rows whose maximum rose, and O += P.V on 2 x 2 tiles loaded from and
// stored back to O. All queries of an item (several samples' rows with a shared prompt) go through the same tiles
// 16 rows at a time; every row's arithmetic depends on its own data only, so the work split never changes a result.
// While a block's tiles run, a bf16 cache's next block of rows is prefetched into L2.
// GCC 12 warns falsely about _mm512_undefined_ps inside the max/roundscale/scalef intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/attention/attention.h"
#include "backends/cpu/attention/exp2_avx512.h"

// The tile instructions as asm with a memory clobber: GCC 12's _tile_loadd has none (a store to the operand just
// before could be moved past it) and its _tile_loadconfig declares only the first 8 bytes of the configuration read.
#define ALP_TILE_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define ALP_TILE_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(static_cast<long>(stride)) : "memory")
#define ALP_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
// C += A.B over bf16 pairs, fp32 C.
#define ALP_TILE_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

namespace alpamayo::cpu {
namespace {

// The tile configuration (palette 1): all 8 tiles 16 rows x 64 bytes. QK: tiles 0-3 S, 4-5 Q, 6-7 K;
// PV: 0-3 O, 4-5 P, 6-7 V.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Row strides of the block's operands, padded by one cache line past a power of two: rows 1 KB or 512 B apart put
// a tile's 16 rows (and a key chunk's 8 tiles) into a few of L1's 64 sets, which then evicted one another.
constexpr int kKbLd = kAmxKeyBlock + kAmxPad;     // packed keys (pairs) and scores (fp32) per row
constexpr int kPLd = kAmxKeyBlock + 2 * kAmxPad;  // probabilities (bf16) per row
inline int v_ld(int dp) { return dp + kAmxPad; }  // value pairs per row

void load_tile_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
}

// Where keys jb .. jb+n-1 are: an int8 cache's rows and scales (the backend's own buffers, rows d apart), or the bf16
// rows through key_row_ptrs, the one place that maps the key sequence onto segments, strided views and pages.
void resolve_rows(const KeyRows& kv, int d, int jb, int n, const AttnWork& w) {
  if (!kv.int8) {
    key_row_ptrs(kv, d, jb, n, n, w.zero, w.kptr, w.vptr);
    return;
  }
  for (int k = 0; k < n; ++k) {
    const int j = jb + k;
    const int seg = j < kv.S ? 0 : j < kv.S + kv.S2 ? 1 : 2;
    const size_t i = size_t(j - (seg == 0 ? 0 : seg == 1 ? kv.S : kv.S + kv.S2));
    const KeyRows::Int8Segment& s = kv.i8[seg];
    w.k8ptr[k] = s.k + i * d, w.v8ptr[k] = s.v + i * d, w.kscale[k] = s.ks[i], w.vscale[k] = s.vs[i];
  }
}

// 32 values of row k from column c (fewer where d ends: zeros) as bf16: a bf16 row as is, an int8 cache's row as
// its integers (exact in bf16; key rows are stored q + 128), the row's scale applied in the softmax instead.
template <bool Int8, bool Key>
inline __m512i row32(const AttnWork& w, int k, int c, int d) {
  const int left = d - c;
  const __mmask32 mask = left >= 32 ? ~__mmask32(0) : ((__mmask32(1) << left) - 1);
  if constexpr (!Int8) {
    return _mm512_maskz_loadu_epi16(mask, (Key ? w.kptr[k] : w.vptr[k]) + c);
  } else {
    const __m256i b = _mm256_maskz_loadu_epi8(mask, Key ? static_cast<const void*>(w.k8ptr[k] + c)
                                                        : static_cast<const void*>(w.v8ptr[k] + c));
    __m512i lo, hi;
    if constexpr (Key) {
      const __m512i off = _mm512_set1_epi32(128);
      lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(b)), off);
      hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(b, 1)), off);
    } else {
      lo = _mm512_cvtepi8_epi32(_mm256_castsi256_si128(b));
      hi = _mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1));
    }
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(hi), _mm512_cvtepi32_ps(lo));
    return _mm512_maskz_mov_epi16(mask, v);  // columns past d read u8 0, key -128
  }
}

// In-register transpose of 16 x 16 32-bit elements: r[i] lane j -> r[j] lane i.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + b] lane group L: rows i..i+3, column 4L + b
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int b = 0; b < 4; ++b) {
    t[b] = _mm512_shuffle_i32x4(r[b], r[4 + b], 0x88);
    t[4 + b] = _mm512_shuffle_i32x4(r[b], r[4 + b], 0xdd);
    t[8 + b] = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0x88);
    t[12 + b] = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0xdd);
  }
  for (int b = 0; b < 4; ++b) {
    r[b] = _mm512_shuffle_i32x4(t[b], t[8 + b], 0x88);
    r[4 + b] = _mm512_shuffle_i32x4(t[4 + b], t[12 + b], 0x88);
    r[8 + b] = _mm512_shuffle_i32x4(t[b], t[8 + b], 0xdd);
    r[12 + b] = _mm512_shuffle_i32x4(t[4 + b], t[12 + b], 0xdd);
  }
}

// Keys as pairs per 16 keys: Kb[i][k] = (key_k[2i], key_k[2i+1]) for i < dp/2, k < npad (row stride kKbLd);
// keys >= n and dims >= d zero.
template <bool Int8>
void pack_keys(const AttnWork& w, int d, int dp, int n, int npad, uint32_t* Kb) {
  for (int k0 = 0; k0 < npad; k0 += 16)
    for (int c = 0; c < dp; c += 32) {
      __m512i r[16];
      for (int k = 0; k < 16; ++k)
        r[k] = k0 + k < n && c < d ? row32<Int8, true>(w, k0 + k, c, d) : _mm512_setzero_si512();
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(Kb + size_t(c / 2 + i) * kKbLd + k0, r[i]);
    }
}

// Values as pairs per 2 keys: V[k/2][c] = (v_k[c], v_k+1[c]) for c < dp (row stride v_ld(dp)); keys >= n zero.
template <bool Int8>
void pack_values(const AttnWork& w, int d, int dp, int n, int npad, uint32_t* V) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                      6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int k = 0; k < npad; k += 2)
    for (int c = 0; c < dp; c += 32) {
      const __m512i a = k < n && c < d ? row32<Int8, false>(w, k, c, d) : _mm512_setzero_si512();
      const __m512i b = k + 1 < n && c < d ? row32<Int8, false>(w, k + 1, c, d) : _mm512_setzero_si512();
      _mm512_store_si512(V + size_t(k / 2) * v_ld(dp) + c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(V + size_t(k / 2) * v_ld(dp) + c + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
}

// The queries row-major: Qa[r][c] for r < Rp, c < dp (bf16, row stride dp), from the pairs qp[i * qld + r]:
// 16 x 16 pairs at a time, transposed in registers.
void pack_queries(const AttnGeometry& g, const uint32_t* qp, uint16_t* Qa) {
  uint32_t* q = reinterpret_cast<uint32_t*>(Qa);
  const int half = g.d / 2, dph = g.dp / 2;
  for (int r0 = 0; r0 < g.Rp; r0 += 16)
    for (int i0 = 0; i0 < dph; i0 += 16) {
      __m512i t[16];
      for (int i = 0; i < 16; ++i)
        t[i] = i0 + i < half ? _mm512_loadu_si512(qp + size_t(i0 + i) * g.qld + r0) : _mm512_setzero_si512();
      transpose16(t);
      for (int r = 0; r < 16; ++r) _mm512_storeu_si512(q + size_t(r0 + r) * dph + i0, t[r]);
    }
}

// S[r - r0][k0 .. k0+31] (row stride kKbLd) for the 16 or 32 (two) query rows from r0: 2 x 2 tiles of 16 x 16.
void qk_chunk(const uint16_t* Qa, int dp, const uint32_t* Kb, int k0, int r0, bool two, float* S) {
  const size_t qs = size_t(dp) * 2, ks = kKbLd * 4, ss = kKbLd * 4;
  ALP_TILE_ZERO(0);
  ALP_TILE_ZERO(1);
  if (two) {
    ALP_TILE_ZERO(2);
    ALP_TILE_ZERO(3);
  }
  for (int c = 0; c < dp; c += 32) {
    ALP_TILE_LOAD(4, Qa + size_t(r0) * dp + c, qs);
    ALP_TILE_LOAD(6, Kb + size_t(c / 2) * kKbLd + k0, ks);
    ALP_TILE_LOAD(7, Kb + size_t(c / 2) * kKbLd + k0 + 16, ks);
    ALP_TILE_DP(0, 4, 6);
    ALP_TILE_DP(1, 4, 7);
    if (two) {
      ALP_TILE_LOAD(5, Qa + size_t(r0 + 16) * dp + c, qs);
      ALP_TILE_DP(2, 5, 6);
      ALP_TILE_DP(3, 5, 7);
    }
  }
  ALP_TILE_STORE(0, S + k0, ss);
  ALP_TILE_STORE(1, S + k0 + 16, ss);
  if (two) {
    ALP_TILE_STORE(2, S + size_t(16) * kKbLd + k0, ss);
    ALP_TILE_STORE(3, S + size_t(16) * kKbLd + k0 + 16, ss);
  }
}

// O[r][c0 .. c0+31] += P[r - r0][k] V[k][c] over keys [0, npad) for the 16 or 32 (two) rows from r0.
void pv_chunk(const uint16_t* P, const uint32_t* V, int dp, int npad, int c0, int r0, bool two, float* O) {
  const size_t os = size_t(dp) * 4, ps = kPLd * 2, vs = size_t(v_ld(dp)) * 4;
  float* o = O + size_t(r0) * dp + c0;
  ALP_TILE_LOAD(0, o, os);
  ALP_TILE_LOAD(1, o + 16, os);
  if (two) {
    ALP_TILE_LOAD(2, o + size_t(16) * dp, os);
    ALP_TILE_LOAD(3, o + size_t(16) * dp + 16, os);
  }
  for (int k = 0; k < npad; k += 32) {
    ALP_TILE_LOAD(4, P + k, ps);
    ALP_TILE_LOAD(6, V + size_t(k / 2) * v_ld(dp) + c0, vs);
    ALP_TILE_LOAD(7, V + size_t(k / 2) * v_ld(dp) + c0 + 16, vs);
    ALP_TILE_DP(0, 4, 6);
    ALP_TILE_DP(1, 4, 7);
    if (two) {
      ALP_TILE_LOAD(5, P + size_t(16) * kPLd + k, ps);
      ALP_TILE_DP(2, 5, 6);
      ALP_TILE_DP(3, 5, 7);
    }
  }
  ALP_TILE_STORE(0, o, os);
  ALP_TILE_STORE(1, o + 16, os);
  if (two) {
    ALP_TILE_STORE(2, o + size_t(16) * dp, os);
    ALP_TILE_STORE(3, o + size_t(16) * dp + 16, os);
  }
}

// Sixteen row vectors reduced at once: lane r of the result is op over the 16 lanes of v[kSlot[r]], paired as
// _mm512_reduce_*_ps pairs them (lanes i and i+8, then i+4, i+2, i+1), so a sum is bitwise that of the per-row
// reduction, in 46 instructions instead of 16 x 10. kSlot is its own inverse.
constexpr int kSlot[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
template <class Op>
inline __m512 reduce16(const __m512 (&v)[16], Op op) {
  __m512 w[8], u[4], z[2];
  for (int i = 0; i < 8; ++i)  // blocks: v[i] (lanes j, j+8), v[i] (j+4, j+12), v[i+8] (..), v[i+8] (..)
    w[i] = op(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
  for (int i = 0; i < 4; ++i)  // blocks: v[i], v[i+8], v[i+4], v[i+12], 4 lanes each
    u[i] = op(_mm512_shuffle_f32x4(w[i], w[i + 4], 0x88), _mm512_shuffle_f32x4(w[i], w[i + 4], 0xdd));
  for (int i = 0; i < 2; ++i)  // per block: lanes 0-1 u[i]'s row, 2-3 u[i+2]'s
    z[i] = op(_mm512_shuffle_ps(u[i], u[i + 2], 0x44), _mm512_shuffle_ps(u[i], u[i + 2], 0xee));
  return op(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xdd));
}

// The online-softmax update of 16 rows from r0 for a block of n valid keys (npad, a multiple of 32): the row maxima
// of S (these rows' scores, [16][kKbLd]), m raised to them, the probabilities 2^(s c - m) rounded to bf16 into
// P[r - r0][k] (keys >= n zero), l rescaled and added to, and the rows of O whose maximum rose rescaled. An int8
// cache's products are of its integers: S is first multiplied by the key rows' scales ks, and P holds p times the
// value rows' scales vs (l adds p itself). The full vectors of 16 keys
// take no mask; only the last, partial one (n % 16 keys) and the zero padding past it do.
template <bool Int8>
void softmax_rows(const AttnGeometry& g, float* S, int n, int npad, int r0, const float* ks, const float* vs,
                  uint16_t* P, float* O, float* m, float* l) {
  const __m512 scale = _mm512_set1_ps(g.scale_log2);
  const int nv = npad / 16, full = n / 16;
  const __mmask16 tail = __mmask16((1u << (n % 16)) - 1);
  alignas(64) float mnew[16], alpha[16];
  __m512 red[16];
  for (int r = 0; r < 16; ++r) {
    float* s = S + size_t(r) * kKbLd;
    __m512 v = _mm512_set1_ps(-INFINITY);
    for (int k = 0; k < full; ++k) {
      __m512 x = _mm512_load_ps(s + 16 * k);
      if constexpr (Int8) {
        x = _mm512_mul_ps(x, _mm512_loadu_ps(ks + 16 * k));
        _mm512_store_ps(s + 16 * k, x);
      }
      v = _mm512_max_ps(v, x);
    }
    if (tail) {
      __m512 x = _mm512_load_ps(s + 16 * full);
      if constexpr (Int8) {
        x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(tail, ks + 16 * full));
        _mm512_store_ps(s + 16 * full, x);
      }
      v = _mm512_mask_max_ps(v, tail, v, x);
    }
    red[kSlot[r]] = v;
  }
  const __m512 mx = reduce16(red, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
  const __m512 m_old = _mm512_loadu_ps(m + r0);
  const __m512 m_new = _mm512_max_ps(m_old, _mm512_mul_ps(mx, scale));
  // m_old is -inf before the first block: clamp so that alpha is 0 rather than NaN.
  const __m512 a = exp2_ps<6>(_mm512_max_ps(_mm512_sub_ps(m_old, m_new), _mm512_set1_ps(-200.f)));
  _mm512_store_ps(mnew, m_new);
  _mm512_store_ps(alpha, a);
  for (int r = 0; r < 16; ++r) {
    const float* s = S + size_t(r) * kKbLd;
    uint16_t* p = P + size_t(r) * kPLd;
    const __m512 mb = _mm512_set1_ps(mnew[r]);
    __m512 acc = _mm512_setzero_ps();
    int k = 0;
    for (; k + 2 <= full; k += 2) {
      __m512 p0 = exp2_p3_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 16 * k), scale, mb));
      __m512 p1 = exp2_p3_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 16 * k + 16), scale, mb));
      acc = _mm512_add_ps(_mm512_add_ps(acc, p0), p1);
      if constexpr (Int8) {
        p0 = _mm512_mul_ps(p0, _mm512_loadu_ps(vs + 16 * k));
        p1 = _mm512_mul_ps(p1, _mm512_loadu_ps(vs + 16 * k + 16));
      }
      _mm512_store_si512(p + 16 * k, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    for (; k < nv; k += 2) {  // the last vectors: masked, zero past n
      __m512 p2[2];
      for (int h = 0; h < 2; ++h) {
        const int kk = k + h;
        const __mmask16 valid = kk < full ? __mmask16(0xffff) : kk == full ? tail : __mmask16(0);
        p2[h] = valid ? _mm512_maskz_mov_ps(valid, exp2_p3_ps(_mm512_fmsub_ps(_mm512_load_ps(s + 16 * kk), scale, mb)))
                      : _mm512_setzero_ps();
        acc = _mm512_add_ps(acc, p2[h]);
        if constexpr (Int8) p2[h] = _mm512_mul_ps(p2[h], _mm512_maskz_loadu_ps(valid, vs + 16 * kk));
      }
      _mm512_store_si512(p + 16 * k, (__m512i)_mm512_cvtne2ps_pbh(p2[1], p2[0]));
    }
    red[kSlot[r]] = acc;
    if (alpha[r] != 1.f) {
      const __m512 ar = _mm512_set1_ps(alpha[r]);
      float* o = O + size_t(r0 + r) * g.dp;
      for (int c = 0; c < g.dp; c += 16) _mm512_store_ps(o + c, _mm512_mul_ps(_mm512_load_ps(o + c), ar));
    }
  }
  const __m512 sum = reduce16(red, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
  _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), a, sum));
  _mm512_storeu_ps(m + r0, m_new);
}

// The cache lines of a bf16 cache's next key block (its key and value rows, pointers from key_row_ptrs) towards L2,
// `per` whole keys a step, the steps spread over the block's tile products so that the misses overlap the tiles
// (a per-line cursor cost more in bookkeeping than it saved from cache).
struct RowPrefetch {
  const uint16_t* const* kp;
  const uint16_t* const* vp;
  int bytes, keys, per;  // bytes per row, keys to prefetch, keys a step
  int k = 0;
  void step() {
    for (const int e = k + per < keys ? k + per : keys; k < e; ++k) {
      const char* kr = reinterpret_cast<const char*>(kp[k]);
      const char* vr = reinterpret_cast<const char*>(vp[k]);
      for (int b = 0; b < bytes; b += 64) _mm_prefetch(kr + b, _MM_HINT_T1), _mm_prefetch(vr + b, _MM_HINT_T1);
      if ((reinterpret_cast<uintptr_t>(kr) | reinterpret_cast<uintptr_t>(vr)) & 63)  // a row's last line
        _mm_prefetch(kr + bytes - 1, _MM_HINT_T1), _mm_prefetch(vr + bytes - 1, _MM_HINT_T1);
    }
  }
};

// Per block: the keys and values packed once, then for each row group of up to kAmxRowGroup rows its scores, its
// softmax and its P.V, one after the other, so that the group's scores and probabilities are read back while they
// are still in L1. (Interleaving the next group's tile products with the softmax measured no gain: on the CPUs
// measured the tile unit and the vector units did not overlap; docs/PERFORMANCE.md.)
template <bool Int8>
void attend(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O, float* m,
            float* l, const AttnWork& w) {
  load_tile_config();
  pack_queries(g, qp, w.qa);
  const int groups = (g.Rp + kAmxRowGroup - 1) / kAmxRowGroup;
  float* S = w.s;
  uint16_t* P = reinterpret_cast<uint16_t*>(w.p);
  size_t ex_off = 0;  // progress through kv.prefetch
  bool resolved = false;  // this block's rows already resolved (the previous block's prefetch did it)
  for (int jb = j0, n = 0; jb < j1; jb += n) {
    n = j1 - jb < kAmxKeyBlock ? j1 - jb : kAmxKeyBlock;
    const int npad = (n + 31) / 32 * 32;
    if (!resolved) resolve_rows(kv, g.d, jb, n, w);
    pack_keys<Int8>(w, g.d, g.dp, n, npad, w.kb);
    pack_values<Int8>(w, g.d, g.dp, n, npad, w.v);
    // A bf16 cache's next block: its row pointers resolved now (this block's are no longer needed once packed; an
    // int8 cache's scales still are) and its rows prefetched a few keys after each score and P.V chunk, so that
    // they come from L2 when that block is packed (the packing otherwise waits on their loads).
    const int nn = !Int8 && jb + n < j1 ? (j1 - jb - n < kAmxKeyBlock ? j1 - jb - n : kAmxKeyBlock) : 0;
    if (nn > 0) resolve_rows(kv, g.d, jb + n, nn, w);
    resolved = nn > 0;
    const int pf_steps = groups * (npad / 32 + g.dp / 32);
    RowPrefetch pf{w.kptr, w.vptr, 2 * g.d, nn, (nn + pf_steps - 1) / pf_steps};
    // This block's share of the caller's region streams into L2 while the tiles work, spread over the row groups.
    const size_t ex_block = ((kv.prefetch_bytes * kAmxKeyBlock) / size_t(j1 - j0 > 0 ? j1 - j0 : 1) + 63) / 64 * 64;
    const size_t ex_end = ex_off + ex_block < kv.prefetch_bytes ? ex_off + ex_block : kv.prefetch_bytes;
    const size_t ex_lines = (ex_end - ex_off) / 64 / groups + 1;
    for (int r0 = 0; r0 < g.Rp; r0 += kAmxRowGroup) {
      const int rows = g.Rp - r0 < kAmxRowGroup ? g.Rp - r0 : kAmxRowGroup;
      for (int k0 = 0; k0 < npad; k0 += 32) {
        for (int h = 0; h < rows; h += 32) qk_chunk(w.qa, g.dp, w.kb, k0, r0 + h, h + 32 <= rows, S + size_t(h) * kKbLd);
        pf.step();
      }
      for (size_t e = ex_off + 64 * ex_lines; kv.prefetch && ex_off < e && ex_off < ex_end; ex_off += 64)
        _mm_prefetch(kv.prefetch + ex_off, _MM_HINT_T1);
      for (int h = 0; h < rows; h += 16)
        softmax_rows<Int8>(g, S + size_t(h) * kKbLd, n, npad, r0 + h, w.kscale, w.vscale, P + size_t(h) * kPLd, O, m, l);
      for (int c0 = 0; c0 < g.dp; c0 += 32) {
        for (int h = 0; h < rows; h += 32) pv_chunk(P + size_t(h) * kPLd, w.v, g.dp, npad, c0, r0 + h, h + 32 <= rows, O);
        pf.step();
      }
    }
  }
  __asm__ volatile("tilerelease" ::: "memory");
}

}  // namespace

void attend_chunk_amx(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O,
                      float* m, float* l, const AttnWork& w) {
  if (kv.int8) attend<true>(g, qp, kv, j0, j1, O, m, l, w);
  else attend<false>(g, qp, kv, j0, j1, O, m, l, w);
}

}  // namespace alpamayo::cpu
