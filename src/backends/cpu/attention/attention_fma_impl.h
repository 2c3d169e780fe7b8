// The fp32-FMA attention kernel, written once over a vector type V and included by the ISA translation units
// attention_avx512_fma.cpp (V = 16 fp32 lanes, zmm) and attention_avx2.cpp (V = 8 lanes, ymm), each of which
// defines V first. Everything here is in an anonymous namespace: each includer gets its own local copy,
// compiled for its own ISA, and no weak symbol (scripts/check-isa-objects.sh).
//
// Same partials as the vdpbf16ps kernel (attention_avx512.cpp): per key block of kKeyBlock keys, scores
// S = Q K^T, a base-2 online-softmax update of (m, l) with the rescale factors alpha, O = O * alpha + P V; after
// a short first block, the exponentials are taken in the QK tiles' epilogue against the running max (no max pass,
// no second pass over S, no rescale of O), with the exact block as the fallback when a score jumps. The
// bf16 queries, keys and values (or an int8 cache's rows, as q * s) are widened to fp32 in scratch (queries once per chunk, keys and values once
// per block) and multiplied with fp32 FMAs, the probabilities stay fp32: where vdpbf16ps issues at half the
// rate of an fp32 FMA this is the faster unit (docs/PERFORMANCE.md), and it runs on every AVX2 CPU.
//
// V provides: F (the register type), W (lanes), kQkVecs and kQkKeys (query vectors times keys of a QK register
// tile; kQkKeys divides kKeyBlock), kPvRows and kPvVecs (rows times column vectors of a PV tile; kPvRows
// divides 16), load/loadu/store/storeu, set1, zero, add, sub, mul, max, fmadd (a * b + c), fmsub (a * b - c),
// and exp2 (2^x, 0 below -126, relative error ~1e-7).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/attention/attention.h"

namespace alpamayo::cpu {
namespace {


inline float bf16_bits_f32(uint32_t bits_in_high_half) {
  float f;
  std::memcpy(&f, &bits_in_high_half, 4);
  return f;
}

// qf[c][r] (row stride ls) from the bf16 pairs qp[i][r] (row stride qld): c = 2i, 2i + 1.
inline void widen_queries(const AttnGeometry& g, int ls, const uint32_t* qp, float* qf) {
  for (int i = 0; i < g.d / 2; ++i) {
    const uint32_t* src = qp + size_t(i) * g.qld;
    float* even = qf + size_t(2 * i) * ls;
    float* odd = even + ls;
    for (int r = 0; r < g.Rp; ++r) {
      even[r] = bf16_bits_f32(src[r] << 16);
      odd[r] = bf16_bits_f32(src[r] & 0xffff0000u);
    }
  }
}

// dst[c] for c < n from bf16 src; dst[c] = 0 for n <= c < npad.
inline void widen_row(const uint16_t* src, int n, int npad, float* dst) {
  for (int c = 0; c < n; ++c) dst[c] = bf16_bits_f32(uint32_t(src[c]) << 16);
  for (int c = n; c < npad; ++c) dst[c] = 0.f;
}

// dst[c] = (k8[c] - 128) * s (an int8 cache's key) or v8[c] * s (its value) for c < n; 0 for n <= c < npad.
inline void widen_key_s8(const uint8_t* k8, float s, int n, int npad, float* dst) {
  for (int c = 0; c < n; ++c) dst[c] = static_cast<float>(int(k8[c]) - 128) * s;
  for (int c = n; c < npad; ++c) dst[c] = 0.f;
}
inline void widen_value_s8(const int8_t* v8, float s, int n, int npad, float* dst) {
  for (int c = 0; c < n; ++c) dst[c] = static_cast<float>(v8[c]) * s;
  for (int c = n; c < npad; ++c) dst[c] = 0.f;
}

// acc[v][k] = sum_c qf[c][v * W + lane] * kf[k][c] for NQV vectors of query rows and V::kQkKeys keys.
template <class V, int NQV>
inline void fma_qk_acc(const float* qf, int ls, int d, const float* kf, typename V::F (&acc)[NQV][V::kQkKeys]) {
  constexpr int kFmaQkKeys = V::kQkKeys;
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v)
#pragma GCC unroll 16
    for (int k = 0; k < kFmaQkKeys; ++k) acc[v][k] = V::zero();
  for (int c = 0; c < d; ++c) {
    typename V::F q[NQV];
#pragma GCC unroll 16
    for (int v = 0; v < NQV; ++v) q[v] = V::load(qf + size_t(c) * ls + v * V::W);
#pragma GCC unroll 16
    for (int k = 0; k < kFmaQkKeys; ++k) {
      const typename V::F kb = V::set1(kf[size_t(k) * d + c]);
#pragma GCC unroll 16
      for (int v = 0; v < NQV; ++v) acc[v][k] = V::fmadd(q[v], kb, acc[v][k]);
    }
  }
}

// Raw scores S[k][row] (row stride ls), for the exact block.
template <class V, int NQV>
inline void fma_qk_tile(const float* qf, int ls, int d, const float* kf, float* S) {
  typename V::F acc[NQV][V::kQkKeys];
  fma_qk_acc<V, NQV>(qf, ls, d, kf, acc);
#pragma GCC unroll 16
  for (int k = 0; k < V::kQkKeys; ++k)
#pragma GCC unroll 16
    for (int v = 0; v < NQV; ++v) V::store(S + size_t(k) * ls + v * V::W, acc[v][k]);
}

// The fused block: probabilities P[k][row] = 2^(score * scale - m[row]) against the running max m, which stays
// fixed for the block so that O needs no rescale; keys >= nvalid get 0; row sums added to lsum. A score far above
// m shows up as a huge (or infinite, or NaN) row sum, which the caller checks.
template <class V, int NQV>
inline void fma_qk_exp_tile(const float* qf, int ls, int d, const float* kf, int nvalid, const float* m,
                            typename V::F scale, float* P, float* lsum) {
  typename V::F acc[NQV][V::kQkKeys];
  fma_qk_acc<V, NQV>(qf, ls, d, kf, acc);
#pragma GCC unroll 16
  for (int v = 0; v < NQV; ++v) {
    const typename V::F mv = V::loadu(m + v * V::W);
    typename V::F sum = V::loadu(lsum + v * V::W);
#pragma GCC unroll 16
    for (int k = 0; k < V::kQkKeys; ++k) {
      const typename V::F p = k < nvalid ? V::exp2(V::fmsub(acc[v][k], scale, mv)) : V::zero();
      V::store(P + size_t(k) * ls + v * V::W, p);
      sum = V::add(sum, p);
    }
    V::storeu(lsum + v * V::W, sum);
  }
}

// Online-softmax update for one block of n valid keys (npad >= n): scores -> fp32 probabilities in place
// (keys >= n get 0), m and l updated, O's rescale factors left in alpha.
template <class V>
inline void fma_softmax_block(const AttnGeometry& g, int ls, int n, int npad, float* S, float* m, float* l,
                              float* alpha) {
  const typename V::F scale = V::set1(g.scale_log2);
  for (int r = 0; r < g.Rp; r += V::W) {
    typename V::F mx = V::set1(-INFINITY);
    for (int k = 0; k < n; ++k) mx = V::max(mx, V::load(S + size_t(k) * ls + r));
    const typename V::F m_old = V::loadu(m + r);
    const typename V::F m_new = V::max(m_old, V::mul(mx, scale));
    // m_old is -inf before the first block: clamp so that alpha is 0 rather than NaN.
    const typename V::F a = V::exp2(V::max(V::sub(m_old, m_new), V::set1(-200.f)));
    typename V::F sum = V::zero();
    for (int k = 0; k < n; ++k) {
      float* s = S + size_t(k) * ls + r;
      const typename V::F p = V::exp2(V::fmsub(V::load(s), scale, m_new));
      V::store(s, p);
      sum = V::add(sum, p);
    }
    for (int k = n; k < npad; ++k) V::store(S + size_t(k) * ls + r, V::zero());
    V::storeu(l + r, V::fmadd(V::loadu(l + r), a, sum));
    V::storeu(m + r, m_new);
    V::storeu(alpha + r, a);
  }
}

// O[row][c] = O[row][c] * alpha[row] + sum_k P[k][row] * vf[k][c] for V::kPvRows rows and NCV column vectors
// (row strides: P ls, vf lv, O dp); alpha == nullptr: no rescale (a fused block).
template <class V, int NCV>
inline void fma_pv_tile(const float* P, int ls, const float* vf, int lv, int dp, int npad, const float* alpha,
                        float* O) {
  constexpr int kFmaPvRows = V::kPvRows;
  typename V::F acc[kFmaPvRows][NCV];
#pragma GCC unroll 16
  for (int r = 0; r < kFmaPvRows; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) {
      const typename V::F o = V::loadu(O + size_t(r) * dp + c * V::W);
      acc[r][c] = alpha ? V::mul(o, V::set1(alpha[r])) : o;
    }
  for (int k = 0; k < npad; ++k) {
    typename V::F vv[NCV];
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) vv[c] = V::load(vf + size_t(k) * lv + c * V::W);
#pragma GCC unroll 16
    for (int r = 0; r < kFmaPvRows; ++r) {
      const typename V::F pb = V::set1(P[size_t(k) * ls + r]);
#pragma GCC unroll 16
      for (int c = 0; c < NCV; ++c) acc[r][c] = V::fmadd(pb, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kFmaPvRows; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < NCV; ++c) V::storeu(O + size_t(r) * dp + c * V::W, acc[r][c]);
}

template <class V, int NQV>
inline void fma_qk_rows(const AttnGeometry& g, int ls, const float* qf, const float* kf, int n, int npad,
                        const float* m, float* lsum, float* S) {
  const typename V::F scale = V::set1(g.scale_log2);
  for (int k = 0; k < npad; k += V::kQkKeys) {
    if (m) fma_qk_exp_tile<V, NQV>(qf, ls, g.d, kf + size_t(k) * g.d, n - k, m, scale, S + size_t(k) * ls, lsum);
    else fma_qk_tile<V, NQV>(qf, ls, g.d, kf + size_t(k) * g.d, S + size_t(k) * ls);
  }
}

// Scores (m == nullptr; lsum unused) or fused probabilities against m (row sums into lsum) for all query rows of a
// block.
template <class V>
inline void fma_qk_block(const AttnGeometry& g, int ls, const float* qf, const float* kf, int n, int npad,
                         const float* m, float* lsum, float* S) {
  constexpr int kQkRows = V::kQkVecs * V::W;
  for (int r = 0; r < g.Rp; r += kQkRows) {
    const int nqv = (g.Rp - r) / V::W < V::kQkVecs ? (g.Rp - r) / V::W : V::kQkVecs;
    const float* q = qf + r;
    const float* mr = m ? m + r : nullptr;
    float* s = S + r;
    if (nqv == V::kQkVecs) {
      fma_qk_rows<V, V::kQkVecs>(g, ls, q, kf, n, npad, mr, lsum + r, s);
    } else if constexpr (V::kQkVecs > 1) {
      // Rp is a multiple of 16: the rest is 1 to kQkVecs - 1 vectors.
      if (nqv == 1) fma_qk_rows<V, 1>(g, ls, q, kf, n, npad, mr, lsum + r, s);
      else if constexpr (V::kQkVecs > 2) {
        if (nqv == 2) fma_qk_rows<V, 2>(g, ls, q, kf, n, npad, mr, lsum + r, s);
        else if constexpr (V::kQkVecs > 3) {
          if (nqv == 3) fma_qk_rows<V, 3>(g, ls, q, kf, n, npad, mr, lsum + r, s);
        }
      }
    }
  }
}

// One body on purpose (about 110 lines): the online-softmax state and the output accumulators stay in registers
// across the key loop; split into functions they would pass through memory at every key block.
template <class V>
void attend_fma(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O, float* m,
                float* l, const AttnWork& w) {
  constexpr int kFmaQkKeys = V::kQkKeys;
  static_assert(kKeyBlock % kFmaQkKeys == 0);
  const uint16_t** kptr = w.kptr;
  const uint16_t** vptr = w.vptr;
  float* S = w.s;
  // Padded row strides (attention.h, kFmaPad) for the queries and scores (ls) and the values (lv).
  const int ls = g.Rp + kFmaPad, lv = g.dp + kFmaPad;
  widen_queries(g, ls, qp, w.qf);
  size_t ex_off = 0;  // progress through kv.prefetch
  bool first = true;
  // The first block only establishes the running max (exact two-pass path), so it is kept short.
  constexpr int kFirstBlock = 16;
  static_assert(kFirstBlock % kFmaQkKeys == 0);
  for (int jb = j0, n = 0; jb < j1; jb += n) {
    const int want = first ? kFirstBlock : kKeyBlock;
    n = j1 - jb < want ? j1 - jb : want;
    const int npad = (n + kFmaQkKeys - 1) / kFmaQkKeys * kFmaQkKeys;
    for (int k = 0; k < npad && kv.int8; ++k) {
      const int j = jb + k;
      float* kf = w.kf + size_t(k) * g.d;
      float* vf = w.vf + size_t(k) * lv;
      if (k >= n) {
        widen_row(w.zero, g.d, g.d, kf);
        widen_row(w.zero, g.d, g.dp, vf);
        continue;
      }
      const int seg = j < kv.S ? 0 : j < kv.S + kv.S2 ? 1 : 2;
      const size_t i = size_t(j - (seg == 0 ? 0 : seg == 1 ? kv.S : kv.S + kv.S2));
      const KeyRows::Int8Segment& sg = kv.i8[seg];
      widen_key_s8(sg.k + i * g.d, sg.ks[i], g.d, g.d, kf);
      widen_value_s8(sg.v + i * g.d, sg.vs[i], g.d, g.dp, vf);
    }
    if (!kv.int8) key_row_ptrs(kv, g.d, jb, n, npad, w.zero, kptr, vptr);
    for (int k = 0; k < npad && !kv.int8; ++k) {
      widen_row(kptr[k], g.d, g.d, w.kf + size_t(k) * g.d);
      widen_row(vptr[k], g.d, g.dp, w.vf + size_t(k) * lv);
    }
    // After the first block, the fused path against the running max (as the vdpbf16ps kernel); the exact
    // two-pass block (scores, max, exp, rescale) when there is no max yet or a score jumps too far above it.
    bool fused = !first;
    if (fused) {
      for (int r = 0; r < g.Rp; ++r) w.lblk[r] = 0.f;
      fma_qk_block<V>(g, ls, w.qf, w.kf, n, npad, m, w.lblk, S);
      // A score more than 64 (log2) above the running max makes its row sum exceed 2^64 (or inf, or NaN):
      // redo the block exactly, so that fp32 never overflows in O or l.
      for (int r = 0; r < g.Rp && fused; ++r) fused = w.lblk[r] < 0x1p64f;
      if (fused)
        for (int r = 0; r < g.Rp; ++r) l[r] += w.lblk[r];
    }
    if (!fused) {
      fma_qk_block<V>(g, ls, w.qf, w.kf, n, npad, nullptr, w.lblk, S);
      fma_softmax_block<V>(g, ls, n, npad, S, m, l, w.alpha);
    }
    first = false;
    const float* rescale = fused ? nullptr : w.alpha;
    // While PV computes: L2 prefetches of the next block's cache rows and of this block's share of the
    // caller's region, spread over the row tiles (as in the vdpbf16ps kernel).
    const int next0 = jb + n, next1 = jb + n + kKeyBlock < kv.S ? jb + n + kKeyBlock : kv.S;
    const size_t elem = kv.int8 ? 1 : 2;
    const size_t pf_bytes = next1 > next0 && (kv.int8 || kv.k_cache) ? size_t(next1 - next0) * g.d * elem : 0;
    const char* pf_k = !pf_bytes ? nullptr
                       : kv.int8 ? reinterpret_cast<const char*>(kv.i8[0].k + size_t(next0) * g.d)
                                 : reinterpret_cast<const char*>(kv.k_cache + size_t(next0) * g.d);
    const char* pf_v = !pf_bytes ? nullptr
                       : kv.int8 ? reinterpret_cast<const char*>(kv.i8[0].v + size_t(next0) * g.d)
                                 : reinterpret_cast<const char*>(kv.v_cache + size_t(next0) * g.d);
    constexpr int kFmaPvRows = V::kPvRows;
    static_assert(16 % kFmaPvRows == 0);
    // Column strips outer, row tiles inner: a strip of the widened values (128 keys x 64 columns, 32 KB) stays in
    // L1 while every row tile uses it, and consecutive row tiles share the probabilities' cache lines.
    constexpr int kPvCols = V::kPvVecs * V::W;
    const int strips = (g.dp + kPvCols - 1) / kPvCols;
    const int tiles = g.Rp / kFmaPvRows * strips;
    const size_t pf_step = (pf_bytes / 64 + tiles - 1) / tiles * 64;
    size_t pf_off = 0;
    const size_t ex_block = ((kv.prefetch_bytes * kKeyBlock) / size_t(j1 - j0 > 0 ? j1 - j0 : 1) + 63) / 64 * 64;
    const size_t ex_end = ex_off + ex_block < kv.prefetch_bytes ? ex_off + ex_block : kv.prefetch_bytes;
    const size_t ex_step = ((ex_end - ex_off) / 64 + tiles - 1) / tiles * 64;
    for (int c = 0; c < g.dp; c += kPvCols) {
      for (int r = 0; r < g.Rp; r += kFmaPvRows) {
        for (size_t e = pf_off + pf_step; pf_off < e && pf_off < pf_bytes; pf_off += 64) {
          _mm_prefetch(pf_k + pf_off, _MM_HINT_T1);
          _mm_prefetch(pf_v + pf_off, _MM_HINT_T1);
        }
        for (size_t e = ex_off + ex_step; ex_off < e && ex_off < ex_end; ex_off += 64)
          _mm_prefetch(kv.prefetch + ex_off, _MM_HINT_T1);
        const float* p = S + r;
        const float* a = rescale ? rescale + r : nullptr;
        if (g.dp - c >= kPvCols) {
          fma_pv_tile<V, V::kPvVecs>(p, ls, w.vf + c, lv, g.dp, npad, a, O + size_t(r) * g.dp + c);
        } else {
          // The last columns: pairs of vectors, then one.
          int cc = c;
          for (; g.dp - cc >= 2 * V::W; cc += 2 * V::W)
            fma_pv_tile<V, 2>(p, ls, w.vf + cc, lv, g.dp, npad, a, O + size_t(r) * g.dp + cc);
          for (; cc < g.dp; cc += V::W)
            fma_pv_tile<V, 1>(p, ls, w.vf + cc, lv, g.dp, npad, a, O + size_t(r) * g.dp + cc);
        }
      }
    }
  }
}

}  // namespace
}  // namespace alpamayo::cpu
