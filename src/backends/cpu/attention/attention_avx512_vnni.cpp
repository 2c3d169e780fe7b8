// The AVX512-VNNI attention kernel for an int8 cache (kv int8; attention.h): scores with vpdpbusd on u8 x s8
// quadruples, the probabilities times the values with vpdpwssd on int16 pairs, int32 sums, fp32 online softmax. An ISA translation unit (compiled with the AVX-512 flags, CMakeLists.txt): it
// defines no weak symbol and calls no inline function of a header (scripts/check-isa-objects.sh); callers check
// attn_kernel_unavailable() first.
//
// Per chunk the queries are rounded to int8 per row (scale a/127, a the row's largest |q|) and stored four per
// word; a key row is stored q + 128 (u8), so the sums are sum (k + 128) q = k.q + 128 sum(q), and the second term
// (per query row) is subtracted before scaling. Per key block, as in the vdpbf16ps kernel: scores, then
// probabilities against the running max (fused) or an exact two-pass update of the block; each probability is
// multiplied by its value row's scale and the products are rounded to 15-bit integers per query row and block
// (scale: the row's largest product / 32767), then multiplied with the value rows widened to int16 (two keys per
// word, vpdpwssd) and the int32 sums scaled back into O. The row sums l add the unrounded probabilities.
// GCC 12 warns falsely about _mm512_undefined_ps inside the max/roundscale/scalef/cvtepi32 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/attention/attention.h"
#include "backends/cpu/attention/exp2_avx512.h"

namespace alpamayo::cpu {
namespace {

constexpr int kQkKeys = 4;  // keys per QK register tile (x up to 4 vectors of 16 query rows)
constexpr int kPvRows = 4;  // query rows per PV register tile (x up to 4 vectors of 16 columns)

// acc += the dot products of u8 x s8 quadruples (vpdpbusd) / int16 pairs (vpdpwssd). In asm: GCC 12 expands the
// intrinsics with a copy of the accumulator per call (the PV tile's disassembly showed one register copy per dot).
inline void dpbusd(__m512i& acc, __m512i u8, __m512i s8) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "vm"(s8)); }
inline void dpwssd(__m512i& acc, __m512i a, __m512i b) { asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b)); }

// acc[v][k] += (key_k[4i..4i+3] + 128) . q[v*16 + lane][4i..4i+3]; a key row's last quad may have only two
// bytes (d % 4 == 2: Tail), the missing ones read as 0 (their queries are 0).
template <int NQV, bool Tail>
inline void qk_quad(const uint32_t* q8, int Rp, int i, const uint8_t* const* kptr, __m512i (&acc)[NQV][kQkKeys]) {
  __m512i q[NQV];
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v) q[v] = _mm512_load_si512(q8 + size_t(i) * Rp + v * 16);
#pragma GCC unroll 16
  for (int k = 0; k < kQkKeys; ++k) {
    uint32_t w = 0;
    std::memcpy(&w, kptr[k] + 4 * i, Tail ? 2 : 4);
    const __m512i kb = _mm512_set1_epi32(static_cast<int>(w));
#pragma GCC unroll 16
    for (int v = 0; v < NQV; ++v) dpbusd(acc[v][k], kb, q[v]);
  }
}

// acc[v][k] = sum_c (key_k[c] + 128) * q[v*16 + lane][c] over the query rows' quads q8 (stride Rp).
template <int NQV>
inline void qk_acc(const uint32_t* q8, int Rp, int d, const uint8_t* const* kptr, __m512i (&acc)[NQV][kQkKeys]) {
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v)
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; ++k) acc[v][k] = _mm512_setzero_si512();
  const int full = d / 4;
  for (int i = 0; i < full; ++i) qk_quad<NQV, false>(q8, Rp, i, kptr, acc);
  if (d % 4) qk_quad<NQV, true>(q8, Rp, full, kptr, acc);
}

// The scores of a tile in the base-2 softmax scale: (acc - qcorr[row]) * ks[key] * qs[row].
inline __m512 scores(__m512i acc, __m512i corr, float ks, __m512 qs) {
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, corr)), _mm512_set1_ps(ks)), qs);
}

// Exact path: scaled scores S[k][row].
template <int NQV>
inline void qk_tile(const uint32_t* q8, int Rp, int d, const uint8_t* const* kptr, const float* ks, const float* qs,
                    const int32_t* qcorr, float* S) {
  __m512i acc[NQV][kQkKeys];
  qk_acc<NQV>(q8, Rp, d, kptr, acc);
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v) {
    const __m512 qsv = _mm512_loadu_ps(qs + v * 16);
    const __m512i corr = _mm512_loadu_si512(qcorr + v * 16);
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; ++k) _mm512_store_ps(S + size_t(k) * Rp + v * 16, scores(acc[v][k], corr, ks[k], qsv));
  }
}

// Fused path: probabilities against the running max m (fixed for the block), times the value rows' scales, into
// S[k][row]; their row maxima into pmax, the unscaled probabilities' row sums added to lsum. Keys >= nvalid get
// 0. A score far above m shows up as a huge (or infinite) row sum, which the caller checks.
template <int NQV>
inline void qk_exp_tile(const uint32_t* q8, int Rp, int d, const uint8_t* const* kptr, const float* ks,
                        const float* vs, int nvalid, const float* m, const float* qs, const int32_t* qcorr, float* S,
                        float* lsum, float* pmax) {
  __m512i acc[NQV][kQkKeys];
  qk_acc<NQV>(q8, Rp, d, kptr, acc);
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v) {
    const __m512 mv = _mm512_loadu_ps(m + v * 16), qsv = _mm512_loadu_ps(qs + v * 16);
    const __m512i corr = _mm512_loadu_si512(qcorr + v * 16);
    __m512 sum = _mm512_loadu_ps(lsum + v * 16), mx = _mm512_loadu_ps(pmax + v * 16);
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; ++k) {
      const __m512 p = k < nvalid ? exp2_ps<3>(_mm512_sub_ps(scores(acc[v][k], corr, ks[k], qsv), mv))
                                  : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, p);
      const __m512 pv = _mm512_mul_ps(p, _mm512_set1_ps(vs[k]));
      mx = _mm512_max_ps(mx, pv);
      _mm512_store_ps(S + size_t(k) * Rp + v * 16, pv);
    }
    _mm512_storeu_ps(lsum + v * 16, sum);
    _mm512_storeu_ps(pmax + v * 16, mx);
  }
}

// Exact online-softmax update of rows [r0, r1) for a block of n valid keys (npad >= n): S (scaled scores) becomes
// the probabilities times the value scales, with their row maxima in pmax; m and l updated, O's rescale in alpha.
inline void softmax_block(const AttnGeometry& g, int r0, int r1, int n, int npad, float* S, const float* vs,
                          float* m, float* l, float* alpha, float* pmax) {
  for (int r = r0; r < r1; r += 16) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int k = 0; k < n; ++k) mx = _mm512_max_ps(mx, _mm512_load_ps(S + size_t(k) * g.Rp + r));
    const __m512 m_old = _mm512_loadu_ps(m + r);
    const __m512 m_new = _mm512_max_ps(m_old, mx);
    // m_old is -inf before the first block: clamp so that alpha is 0 rather than NaN.
    const __m512 a = exp2_ps<6>(_mm512_max_ps(_mm512_sub_ps(m_old, m_new), _mm512_set1_ps(-200.f)));
    __m512 sum = _mm512_setzero_ps(), pm = _mm512_setzero_ps();
    for (int k = 0; k < npad; ++k) {
      float* s = S + size_t(k) * g.Rp + r;
      const __m512 p = k < n ? exp2_ps<4>(_mm512_sub_ps(_mm512_load_ps(s), m_new)) : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, p);
      const __m512 pv = _mm512_mul_ps(p, _mm512_set1_ps(vs[k]));
      pm = _mm512_max_ps(pm, pv);
      _mm512_store_ps(s, pv);
    }
    _mm512_storeu_ps(l + r, _mm512_fmadd_ps(_mm512_loadu_ps(l + r), a, sum));
    _mm512_storeu_ps(m + r, m_new);
    _mm512_storeu_ps(alpha + r, a);
    _mm512_storeu_ps(pmax + r, pm);
  }
}

// Four vectors of 16 values in 0..255 (or -127..127) as one vector of byte quadruples (a, b, c, e).
inline __m512i pack_quads(__m512i a, __m512i b, __m512i c, __m512i e) {
  const __m512i lo = _mm512_set1_epi32(0xff);
  const __m512i ab = _mm512_or_si512(_mm512_and_si512(a, lo), _mm512_slli_epi32(_mm512_and_si512(b, lo), 8));
  const __m512i ce = _mm512_or_si512(_mm512_and_si512(c, lo), _mm512_slli_epi32(e, 8));
  return _mm512_or_si512(ab, _mm512_slli_epi32(ce, 16));
}

// Two vectors of 16 values in -32768..32767 as one vector of int16 pairs (a, b).
inline __m512i pack_pairs(__m512i a, __m512i b) {
  return _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(b, 16));
}

// P2[k/2][row] = the probabilities of S rounded to 15 bits against their row maximum (pmax, replaced by the scale
// pmax / 32767 that turns the sums back into probabilities). Not 8 bits: a block's largest probability (an
// attention sink, a spike) would round a long tail of small ones to 0, which together can carry a third of the
// mass (the test's spike case: 17% error with u8).
inline void quantize_probabilities(const AttnGeometry& g, int r0, int r1, int npad, const float* S, float* pmax,
                                   uint32_t* P2) {
  for (int r = r0; r < r1; r += 16) {
    const __m512 pm = _mm512_loadu_ps(pmax + r);
    const __mmask16 pos = _mm512_cmp_ps_mask(pm, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(32767.f), pm);
    _mm512_storeu_ps(pmax + r, _mm512_div_ps(pm, _mm512_set1_ps(32767.f)));
    for (int k = 0; k < npad; k += 2) {
      const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(S + size_t(k) * g.Rp + r), inv));
      const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(S + size_t(k + 1) * g.Rp + r), inv));
      _mm512_store_si512(P2 + size_t(k / 2) * g.Rp + r, pack_pairs(a, b));
    }
  }
}

// V2[k/2][c] = (v_k[c], v_k+1[c]) as int16, columns >= d zero.
inline void pack_values(const AttnGeometry& g, const int8_t* const* vptr, int npad, uint32_t* V2) {
  for (int k = 0; k < npad; k += 2)
    for (int c = 0; c < g.dp; c += 16) {
      const int left = g.d - c;
      const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
      const __m512i a = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, vptr[k] + c));
      const __m512i b = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, vptr[k + 1] + c));
      _mm512_store_si512(V2 + size_t(k / 2) * g.dp + c, pack_pairs(a, b));
    }
}

// q8[i][row] = the queries' int8 quads (rows rounded per row against their largest |q|), qs[row] = that row's
// scale times the softmax's log2(e) / sqrt(d), qcorr[row] = 128 * sum of the row's int8 values.
inline void quantize_queries(const AttnGeometry& g, const uint32_t* qp, uint32_t* q8, float* qs, int32_t* qcorr) {
  const int half = g.d / 2, quads = (g.d + 3) / 4;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  auto lo = [](__m512i pr) { return _mm512_castsi512_ps(_mm512_slli_epi32(pr, 16)); };
  auto hi = [&](__m512i pr) { return _mm512_castsi512_ps(_mm512_and_si512(pr, hi_mask)); };
  for (int r = 0; r < g.Rp; r += 16) {
    __m512 am = _mm512_setzero_ps();
    for (int i = 0; i < half; ++i) {
      const __m512i pr = _mm512_loadu_si512(qp + size_t(i) * g.qld + r);
      am = _mm512_max_ps(am, _mm512_max_ps(_mm512_abs_ps(lo(pr)), _mm512_abs_ps(hi(pr))));
    }
    const __mmask16 pos = _mm512_cmp_ps_mask(am, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(127.f), am);
    _mm512_storeu_ps(qs + r, _mm512_mul_ps(_mm512_div_ps(am, _mm512_set1_ps(127.f)), _mm512_set1_ps(g.scale_log2)));
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < quads; ++i) {
      const __m512i p0 = _mm512_loadu_si512(qp + size_t(2 * i) * g.qld + r);
      const __m512i p1 = 2 * i + 1 < half ? _mm512_loadu_si512(qp + size_t(2 * i + 1) * g.qld + r) : _mm512_setzero_si512();
      const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(lo(p0), inv)), b = _mm512_cvtps_epi32(_mm512_mul_ps(hi(p0), inv));
      const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(lo(p1), inv)), e = _mm512_cvtps_epi32(_mm512_mul_ps(hi(p1), inv));
      sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_add_epi32(a, b), _mm512_add_epi32(c, e)));
      _mm512_store_si512(q8 + size_t(i) * g.Rp + r, pack_quads(a, b, c, e));
    }
    _mm512_storeu_si512(qcorr + r, _mm512_slli_epi32(sum, 7));
  }
}

// O[row][c] = O[row][c] * alpha[row] + pscale[row] * sum_pairs P2(row) . V2(c) (vpdpwssd) for kPvRows rows and
// NCV column vectors; alpha == nullptr: no rescale. Prefetches npf lines of pf_k and pf_v, one of each per pair.
template <int NCV>
inline void pv_tile(const uint32_t* P2, int Rp, const uint32_t* V2, int dp, int pairs, const float* alpha,
                    const float* pscale, float* O, const char* pf_k, const char* pf_v, int npf) {
  __m512i acc[kPvRows][NCV];
#pragma GCC unroll 16
  for (int r = 0; r < kPvRows; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) acc[r][c] = _mm512_setzero_si512();
  const int npf_in = npf < pairs ? npf : pairs;
  for (int jp = 0; jp < pairs; ++jp) {
    if (jp < npf_in) {
      _mm_prefetch(pf_k + 64 * jp, _MM_HINT_T1);
      _mm_prefetch(pf_v + 64 * jp, _MM_HINT_T1);
    }
    __m512i vv[NCV];
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) vv[c] = _mm512_load_si512(V2 + size_t(jp) * dp + c * 16);
#pragma GCC unroll 16
    for (int r = 0; r < kPvRows; ++r) {
      const __m512i pb = _mm512_set1_epi32(static_cast<int>(P2[size_t(jp) * Rp + r]));
#pragma GCC unroll 16
      for (int c = 0; c < NCV; ++c) dpwssd(acc[r][c], pb, vv[c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kPvRows; ++r) {
    const __m512 ps = _mm512_set1_ps(pscale[r]);
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) {
      __m512 o = _mm512_load_ps(O + size_t(r) * dp + c * 16);
      if (alpha) o = _mm512_mul_ps(o, _mm512_set1_ps(alpha[r]));
      _mm512_store_ps(O + size_t(r) * dp + c * 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), ps, o));
    }
  }
  for (int jp = npf_in; jp < npf; ++jp) {
    _mm_prefetch(pf_k + 64 * jp, _MM_HINT_T1);
    _mm_prefetch(pf_v + 64 * jp, _MM_HINT_T1);
  }
}

}  // namespace

// One body on purpose (about 110 lines): the online-softmax state and the output accumulators stay in registers
// across the key loop; split into functions they would pass through memory at every key block.
void attend_chunk_avx512vnni(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                             float* O, float* m, float* l, const AttnWork& sc) {
  const uint8_t** kptr = sc.k8ptr;
  const int8_t** vptr = sc.v8ptr;
  const uint8_t* zero = reinterpret_cast<const uint8_t*>(sc.zero);  // at least d zero bytes
  float* S = sc.s;
  uint32_t* P2 = sc.p;  // [kKeyBlock/2][Rp], as the bf16 kernel's pairs
  uint32_t* V2 = sc.v;  // [kKeyBlock/2][dp] likewise
  float *ks = sc.kscale, *vs = sc.vscale, *alpha = sc.alpha, *lblk = sc.lblk, *pmax = sc.pmax, *qs = sc.qscale;
  const int32_t* qcorr = sc.qcorr;
  quantize_queries(g, qp, sc.q8, qs, sc.qcorr);
  bool first = true;
  size_t ex_off = 0;  // progress through kv.prefetch
  // The first block only establishes the running max (exact two-pass path), so it is kept short.
  constexpr int kFirstBlock = 16;
  for (int jb = j0, n = 0; jb < j1; jb += n) {
    const int want = first ? kFirstBlock : kKeyBlock;
    n = j1 - jb < want ? j1 - jb : want;
    const int npad = (n + 3) / 4 * 4;
    for (int k = 0; k < npad; ++k) {
      const int j = jb + k;
      if (k >= n) {
        kptr[k] = zero;
        vptr[k] = reinterpret_cast<const int8_t*>(zero);
        ks[k] = vs[k] = 0.f;
        continue;
      }
      const int seg = j < kv.S ? 0 : j < kv.S + kv.S2 ? 1 : 2;
      const size_t i = size_t(j - (seg == 0 ? 0 : seg == 1 ? kv.S : kv.S + kv.S2));
      const KeyRows::Int8Segment& sg = kv.i8[seg];
      kptr[k] = sg.k + i * g.d;
      vptr[k] = sg.v + i * g.d;
      ks[k] = sg.ks[i];
      vs[k] = sg.vs[i];
    }
    pack_values(g, vptr, npad, V2);
    // The next block's cache rows stream in from memory while this one computes, and this block's share of the
    // caller's region: L2 prefetches spread over the PV row tiles and within a tile one line per pair (as in the
    // vdpbf16ps kernel).
    const int next0 = jb + n, next1 = jb + n + kKeyBlock < kv.S ? jb + n + kKeyBlock : kv.S;
    const size_t pf_bytes = next1 > next0 ? size_t(next1 - next0) * g.d : 0;
    // (No pointer into the rows unless there are rows: a chunk without cache rows has none.)
    const char* pf_k = pf_bytes ? reinterpret_cast<const char*>(kv.i8[0].k + size_t(next0) * g.d) : nullptr;
    const char* pf_v = pf_bytes ? reinterpret_cast<const char*>(kv.i8[0].v + size_t(next0) * g.d) : nullptr;
    const size_t pf_step = (pf_bytes / 64 + g.Rp / kPvRows - 1) / (g.Rp / kPvRows) * 64;
    size_t pf_off = 0;
    const size_t ex_block = ((kv.prefetch_bytes * kKeyBlock) / size_t(j1 - j0 > 0 ? j1 - j0 : 1) + 63) / 64 * 64;
    const size_t ex_end = ex_off + ex_block < kv.prefetch_bytes ? ex_off + ex_block : kv.prefetch_bytes;
    const size_t ex_step = ((ex_end - ex_off) / 64 + g.Rp / kPvRows - 1) / (g.Rp / kPvRows) * 64;
    const int pairs = npad / 2, ncv = g.dp / 16;
    // Groups of 64 query rows from scores to O, so that their probabilities stay in L1 (32 KB) between the
    // passes. After the first block, the fused path against the running max; the exact two-pass update where
    // there is no max yet or a score jumps too far.
    for (int r0 = 0; r0 < g.Rp; r0 += 64) {
      const int r1 = g.Rp - r0 < 64 ? g.Rp : r0 + 64, nqv = (r1 - r0) / 16;
      bool fused = !first;
      if (fused) {
        for (int r = r0; r < r1; ++r) lblk[r] = pmax[r] = 0.f;
        for (int k = 0; k < npad; k += kQkKeys) {
          const uint32_t* q = sc.q8 + r0;
          float* s = S + size_t(k) * g.Rp + r0;
          const int nv = n - k;
          switch (nqv) {
            case 4: qk_exp_tile<4>(q, g.Rp, g.d, kptr + k, ks + k, vs + k, nv, m + r0, qs + r0, qcorr + r0, s, lblk + r0, pmax + r0); break;
            case 3: qk_exp_tile<3>(q, g.Rp, g.d, kptr + k, ks + k, vs + k, nv, m + r0, qs + r0, qcorr + r0, s, lblk + r0, pmax + r0); break;
            case 2: qk_exp_tile<2>(q, g.Rp, g.d, kptr + k, ks + k, vs + k, nv, m + r0, qs + r0, qcorr + r0, s, lblk + r0, pmax + r0); break;
            default: qk_exp_tile<1>(q, g.Rp, g.d, kptr + k, ks + k, vs + k, nv, m + r0, qs + r0, qcorr + r0, s, lblk + r0, pmax + r0); break;
          }
        }
        // A score more than 64 (log2) above the running max makes its row sum exceed 2^64 (or inf): redo these
        // rows exactly, so that fp32 never overflows in O or l.
        for (int r = r0; r < r1 && fused; ++r) fused = lblk[r] < 0x1p64f;
        if (fused)
          for (int r = r0; r < r1; ++r) l[r] += lblk[r];
      }
      if (!fused) {
        for (int k = 0; k < npad; k += kQkKeys) {
          const uint32_t* q = sc.q8 + r0;
          float* s = S + size_t(k) * g.Rp + r0;
          switch (nqv) {
            case 4: qk_tile<4>(q, g.Rp, g.d, kptr + k, ks + k, qs + r0, qcorr + r0, s); break;
            case 3: qk_tile<3>(q, g.Rp, g.d, kptr + k, ks + k, qs + r0, qcorr + r0, s); break;
            case 2: qk_tile<2>(q, g.Rp, g.d, kptr + k, ks + k, qs + r0, qcorr + r0, s); break;
            default: qk_tile<1>(q, g.Rp, g.d, kptr + k, ks + k, qs + r0, qcorr + r0, s); break;
          }
        }
        softmax_block(g, r0, r1, n, npad, S, vs, m, l, alpha, pmax);
      }
      quantize_probabilities(g, r0, r1, npad, S, pmax, P2);  // pmax now holds their scales
      const float* rescale = fused ? nullptr : alpha;
      for (int r = r0; r < r1; r += kPvRows) {
        const size_t pf_end = pf_off + pf_step < pf_bytes ? pf_off + pf_step : (pf_bytes > pf_off ? pf_bytes : pf_off);
        int npf = static_cast<int>((pf_end - pf_off) / 64);
        for (size_t e = ex_off + ex_step; ex_off < e && ex_off < ex_end; ex_off += 64)
          _mm_prefetch(kv.prefetch + ex_off, _MM_HINT_T1);
        const uint32_t* p = P2 + r;
        for (int c = 0; c < ncv; c += 4) {
          const uint32_t* v = V2 + c * 16;
          float* o = O + size_t(r) * g.dp + c * 16;
          const float* a = rescale ? rescale + r : nullptr;
          if (ncv - c >= 4)
            pv_tile<4>(p, g.Rp, v, g.dp, pairs, a, pmax + r, o, pf_k + pf_off, pf_v + pf_off, npf);
          else
            pv_tile<2>(p, g.Rp, v, g.dp, pairs, a, pmax + r, o, pf_k + pf_off, pf_v + pf_off, npf);
          npf = 0;
        }
        pf_off = pf_end;
      }
    }
    first = false;
  }
}

}  // namespace alpamayo::cpu
