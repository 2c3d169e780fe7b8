// The AVX512-BF16 attention block kernels (vdpbf16ps, fp32 accumulation). An ISA translation unit (compiled
// with the AVX-512 flags, CMakeLists.txt): it defines no weak symbol and calls no inline function of a
// header (scripts/check-isa-objects.sh); callers check attn_kernel_unavailable() first.
// GCC 12 warns falsely about _mm512_undefined_ps inside the max/roundscale/scalef intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/attention/attention.h"
#include "backends/cpu/attention/exp2_avx512.h"

#define ALP_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")))

namespace alpamayo::cpu {
namespace {

constexpr int kQkKeys = 4;   // keys per QK register tile (x up to 4 vectors of 16 query rows)
constexpr int kPvRows = 4;   // query rows per PV register tile (x up to 4 vectors of 16 columns)

inline uint32_t load_pair(const uint16_t* row, int i) {
  uint32_t v;
  std::memcpy(&v, row + 2 * i, 4);
  return v;
}

// acc[v][k] = sum_c q[v*16 + lane][c] * key_k[c] for NQV query vectors and kQkKeys keys.
template <int NQV>
ALP_BF16 inline void qk_acc(const uint32_t* qp, int qld, int half, const uint16_t* const* kptr,
                            __m512 (&acc)[NQV][kQkKeys]) {
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v)
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; ++k) acc[v][k] = _mm512_setzero_ps();
  for (int i = 0; i < half; ++i) {
    __m512bh q[NQV];
#pragma GCC unroll 16
    for (int v = 0; v < NQV; ++v) q[v] = (__m512bh)_mm512_load_si512(qp + size_t(i) * qld + v * 16);
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; ++k) {
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(load_pair(kptr[k], i)));
#pragma GCC unroll 16
      for (int v = 0; v < NQV; ++v) acc[v][k] = _mm512_dpbf16_ps(acc[v][k], q[v], kb);
    }
  }
}

// Raw scores S[k][row] for the exact (two-pass) block path.
template <int NQV>
ALP_BF16 inline void qk_tile(const uint32_t* qp, int qld, int Rp, int half, const uint16_t* const* kptr, float* S) {
  __m512 acc[NQV][kQkKeys];
  qk_acc<NQV>(qp, qld, half, kptr, acc);
#pragma GCC unroll 16
  for (int k = 0; k < kQkKeys; ++k)
#pragma GCC unroll 16
    for (int v = 0; v < NQV; ++v) _mm512_store_ps(S + size_t(k) * Rp + v * 16, acc[v][k]);
}

// Fused path: probabilities against the running max m (kept fixed for the block, so O needs no
// rescale), written as bf16 pairs P[k/2][row]; row sums added to lsum. Keys >= nvalid get p = 0.
// A score far above m shows up as a huge (or infinite) row sum, which the caller checks.
template <int NQV>
ALP_BF16 inline void qk_exp_tile(const uint32_t* qp, int qld, int Rp, int half, const uint16_t* const* kptr,
                                 int nvalid, const float* m, __m512 scale, uint32_t* P, float* lsum) {
  __m512 acc[NQV][kQkKeys];
  qk_acc<NQV>(qp, qld, half, kptr, acc);
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v) {
    const __m512 mv = _mm512_loadu_ps(m + v * 16);
    __m512 p[kQkKeys];
    __m512 sum = _mm512_loadu_ps(lsum + v * 16);
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; ++k) {
      const __m512 x = _mm512_fmsub_ps(acc[v][k], scale, mv);
      p[k] = k < nvalid ? exp2_ps<3>(x) : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, p[k]);
    }
    _mm512_storeu_ps(lsum + v * 16, sum);
#pragma GCC unroll 16
    for (int k = 0; k < kQkKeys; k += 2) {
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p[k + 1], p[k]);
      _mm512_store_si512(P + size_t(k / 2) * Rp + v * 16, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// O[row][c] = O[row][c] * alpha[row] + sum_pairs P(row) . V(c) for kPvRows rows and NCV column vectors.
// alpha == nullptr: no rescale.
template <int NCV>
ALP_BF16 inline void pv_tile(const uint32_t* P, int Rp, const uint32_t* V, int dp, int pairs, const float* alpha,
                             float* O, const char* pf_k, const char* pf_v, int npf) {
  __m512 acc[kPvRows][NCV];
#pragma GCC unroll 16
  for (int r = 0; r < kPvRows; ++r) {
    const __m512 a = _mm512_set1_ps(alpha ? alpha[r] : 1.f);
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c)
      acc[r][c] = alpha ? _mm512_mul_ps(_mm512_load_ps(O + size_t(r) * dp + c * 16), a)
                        : _mm512_load_ps(O + size_t(r) * dp + c * 16);
  }
  const int npf_in = npf < pairs ? npf : pairs;
  for (int jp = 0; jp < pairs; ++jp) {
    if (jp < npf_in) {
      _mm_prefetch(pf_k + 64 * jp, _MM_HINT_T1);
      _mm_prefetch(pf_v + 64 * jp, _MM_HINT_T1);
    }
    __m512bh vv[NCV];
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) vv[c] = (__m512bh)_mm512_load_si512(V + size_t(jp) * dp + c * 16);
#pragma GCC unroll 16
    for (int r = 0; r < kPvRows; ++r) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(P[size_t(jp) * Rp + r]));
#pragma GCC unroll 16
      for (int c = 0; c < NCV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], vv[c], pb);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kPvRows; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) _mm512_store_ps(O + size_t(r) * dp + c * 16, acc[r][c]);
  for (int jp = npf_in; jp < npf; ++jp) {
    _mm_prefetch(pf_k + 64 * jp, _MM_HINT_T1);
    _mm_prefetch(pf_v + 64 * jp, _MM_HINT_T1);
  }
}

// Online-softmax update for one block of n valid keys (npad >= n, even): turns scores into bf16
// probability pairs, updates m and l, and leaves the O rescale factors in alpha.
ALP_BF16 inline void softmax_block(const AttnGeometry& g, int n, int npad, float* S, uint32_t* P, float* m, float* l,
                          float* alpha) {
  const __m512 scale = _mm512_set1_ps(g.scale_log2);
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int r = 0; r < g.Rp; r += 16) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int k = 0; k < n; ++k) mx = _mm512_max_ps(mx, _mm512_load_ps(S + size_t(k) * g.Rp + r));
    const __m512 m_old = _mm512_loadu_ps(m + r);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_mul_ps(mx, scale));
    // m_old is -inf before the first block: clamp so that alpha is 0 rather than NaN.
    const __m512 a = exp2_ps<6>(_mm512_max_ps(_mm512_sub_ps(m_old, m_new), _mm512_set1_ps(-200.f)));
    __m512 sum = _mm512_setzero_ps();
    for (int k = 0; k < npad; k += 2) {
      __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
      if (k < n) p0 = exp2_ps<4>(_mm512_fmsub_ps(_mm512_load_ps(S + size_t(k) * g.Rp + r), scale, m_new));
      if (k + 1 < n) p1 = exp2_ps<4>(_mm512_fmsub_ps(_mm512_load_ps(S + size_t(k + 1) * g.Rp + r), scale, m_new));
      sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
      // cvtne2ps: low 16 bf16 from p0, high 16 from p1; interleave to (p0[r], p1[r]) pairs.
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
      _mm512_store_si512(P + size_t(k / 2) * g.Rp + r, _mm512_permutexvar_epi16(interleave, both));
    }
    _mm512_storeu_ps(l + r, _mm512_fmadd_ps(_mm512_loadu_ps(l + r), a, sum));
    _mm512_storeu_ps(m + r, m_new);
    _mm512_storeu_ps(alpha + r, a);
  }
}

// Packs value rows (2jp, 2jp+1) into pairs: V[jp][c] = (v_2jp[c], v_2jp+1[c]), columns >= d zero.
ALP_BF16 inline void pack_values(const AttnGeometry& g, const uint16_t* const* vptr, int npad, uint32_t* V) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                      6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int k = 0; k < npad; k += 2) {
    for (int c = 0; c < g.dp; c += 32) {
      const int left = g.d - c;
      const __mmask32 mask = left >= 32 ? ~__mmask32(0) : ((__mmask32(1) << left) - 1);
      const __m512i a = _mm512_maskz_loadu_epi16(mask, vptr[k] + c);
      const __m512i b = _mm512_maskz_loadu_epi16(mask, vptr[k + 1] + c);
      _mm512_store_si512(V + size_t(k / 2) * g.dp + c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(V + size_t(k / 2) * g.dp + c + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

}  // namespace

// One body on purpose (about 110 lines): the online-softmax state and the output accumulators stay in registers
// across the key loop; split into functions they would pass through memory at every key block.
ALP_BF16 void attend_chunk_avx512bf16(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                             float* O, float* m, float* l, const AttnWork& sc) {
  const int half = g.d / 2;
  const uint16_t** kptr = sc.kptr;
  const uint16_t** vptr = sc.vptr;
  const uint16_t* zero = sc.zero;
  float* S = sc.s;
  uint32_t* P = sc.p;
  uint32_t* V = sc.v;
  float* alpha = sc.alpha;
  float* lblk = sc.lblk;
  const __m512 scale = _mm512_set1_ps(g.scale_log2);
  bool first = true;
  size_t ex_off = 0;  // progress through kv.prefetch
  // The first block only establishes the running max (exact two-pass path), so it is kept short.
  constexpr int kFirstBlock = 16;
  for (int jb = j0, n = 0; jb < j1; jb += n) {
    const int want = first ? kFirstBlock : kKeyBlock;
    n = j1 - jb < want ? j1 - jb : want;
    const int npad = (n + kQkKeys - 1) / kQkKeys * kQkKeys;  // multiple of 4, hence even
    key_row_ptrs(kv, g.d, jb, n, npad, zero, kptr, vptr);
    pack_values(g, vptr, npad, V);
    // After the first block, try the fused path against the running max; fall back to the exact
    // two-pass block (scores, max, exp, rescale) when there is no max yet or a score jumps too far.
    bool fused = !first;
    if (fused) {
      for (int r = 0; r < g.Rp; ++r) lblk[r] = 0.f;
      for (int r = 0; r < g.Rp; r += 64) {
        const int nqv = (g.Rp - r) / 16 < 4 ? (g.Rp - r) / 16 : 4;
        for (int k = 0; k < npad; k += kQkKeys) {
          const uint32_t* q = qp + r;
          uint32_t* p = P + size_t(k / 2) * g.Rp + r;
          const int nv = n - k;
          switch (nqv) {
            case 4: qk_exp_tile<4>(q, g.qld, g.Rp, half, kptr + k, nv, m + r, scale, p, lblk + r); break;
            case 3: qk_exp_tile<3>(q, g.qld, g.Rp, half, kptr + k, nv, m + r, scale, p, lblk + r); break;
            case 2: qk_exp_tile<2>(q, g.qld, g.Rp, half, kptr + k, nv, m + r, scale, p, lblk + r); break;
            default: qk_exp_tile<1>(q, g.qld, g.Rp, half, kptr + k, nv, m + r, scale, p, lblk + r); break;
          }
        }
      }
      // A score more than 64 (log2) above the running max makes its row sum exceed 2^64 (or inf):
      // redo the block exactly, so that fp32 never overflows in O or l.
      for (int r = 0; r < g.Rp && fused; ++r) fused = lblk[r] < 0x1p64f;
      if (fused)
        for (int r = 0; r < g.Rp; ++r) l[r] += lblk[r];
    }
    if (!fused) {
      for (int r = 0; r < g.Rp; r += 64) {
        const int nqv = (g.Rp - r) / 16 < 4 ? (g.Rp - r) / 16 : 4;
        for (int k = 0; k < npad; k += kQkKeys) {
          const uint32_t* q = qp + r;
          float* s = S + size_t(k) * g.Rp + r;
          switch (nqv) {
            case 4: qk_tile<4>(q, g.qld, g.Rp, half, kptr + k, s); break;
            case 3: qk_tile<3>(q, g.qld, g.Rp, half, kptr + k, s); break;
            case 2: qk_tile<2>(q, g.qld, g.Rp, half, kptr + k, s); break;
            default: qk_tile<1>(q, g.qld, g.Rp, half, kptr + k, s); break;
          }
        }
      }
      softmax_block(g, n, npad, S, P, m, l, alpha);
    }
    first = false;
    const float* rescale = fused ? nullptr : alpha;
    const int pairs = npad / 2, ncv = g.dp / 16;
    // The next block's cache rows (contiguous) stream in from memory while PV computes: L2 prefetches spread
    // over the row tiles, and within a tile one line of K and V per pair, so that neither the next block's
    // first touches nor this block's loads stall (a burst per tile filled the miss buffers; docs/PERFORMANCE.md).
    const int next0 = jb + n, next1 = jb + n + kKeyBlock < kv.S ? jb + n + kKeyBlock : kv.S;
    const size_t pf_bytes = next1 > next0 && kv.k_cache ? size_t(next1 - next0) * g.d * 2 : 0;
    const char* pf_k = pf_bytes ? reinterpret_cast<const char*>(kv.k_cache + size_t(next0) * g.d) : nullptr;
    const char* pf_v = pf_bytes ? reinterpret_cast<const char*>(kv.v_cache + size_t(next0) * g.d) : nullptr;
    const size_t pf_step = (pf_bytes / 64 + g.Rp / kPvRows - 1) / (g.Rp / kPvRows) * 64;
    size_t pf_off = 0;
    // The caller's region: this block's share (blocks are ~kKeyBlock keys), spread over the row tiles.
    const size_t ex_block = ((kv.prefetch_bytes * kKeyBlock) / size_t(j1 - j0 > 0 ? j1 - j0 : 1) + 63) / 64 * 64;
    const size_t ex_end = ex_off + ex_block < kv.prefetch_bytes ? ex_off + ex_block : kv.prefetch_bytes;
    const size_t ex_step = ((ex_end - ex_off) / 64 + g.Rp / kPvRows - 1) / (g.Rp / kPvRows) * 64;
    for (int r = 0; r < g.Rp; r += kPvRows) {
      const size_t pf_end = pf_off + pf_step < pf_bytes ? pf_off + pf_step : (pf_bytes > pf_off ? pf_bytes : pf_off);
      int npf = static_cast<int>((pf_end - pf_off) / 64);
      for (size_t e = ex_off + ex_step; ex_off < e && ex_off < ex_end; ex_off += 64)
        _mm_prefetch(kv.prefetch + ex_off, _MM_HINT_T1);
      const uint32_t* p = P + r;
      for (int c = 0; c < ncv; c += 4) {
        const uint32_t* v = V + c * 16;
        float* o = O + size_t(r) * g.dp + c * 16;
        if (ncv - c >= 4)
          pv_tile<4>(p, g.Rp, v, g.dp, pairs, rescale ? rescale + r : nullptr, o, pf_k + pf_off, pf_v + pf_off, npf);
        else
          pv_tile<2>(p, g.Rp, v, g.dp, pairs, rescale ? rescale + r : nullptr, o, pf_k + pf_off, pf_v + pf_off, npf);
        npf = 0;
      }
      pf_off = pf_end;
    }
  }
}

}  // namespace alpamayo::cpu

