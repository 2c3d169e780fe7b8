#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "alpamayo/tensor.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/isa.h"

namespace alpamayo::cpu {

AttnGeometry AttnGeometry::make(int d, int group, int T) {
  AttnGeometry g;
  g.d = d;
  g.dp = (d + 31) / 32 * 32;
  g.R = group * T;
  g.Rp = (g.R + 15) / 16 * 16;
  g.qld = g.Rp;
  g.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(d)));
  return g;
}

void AttnScratch::resize(const AttnGeometry& g) {
  kptr.resize(kKeyBlock);
  vptr.resize(kKeyBlock);
  s.resize(size_t(kKeyBlock) * g.Rp);
  p.resize(size_t(kKeyBlock / 2) * g.Rp);
  v.resize(size_t(kKeyBlock / 2) * g.dp);
  alpha.resize(g.Rp);
  lblk.resize(g.Rp);
  zero.resize(g.dp);
}

void init_partial(const AttnGeometry& g, float* O, float* m, float* l) {
  std::fill(O, O + size_t(g.Rp) * g.dp, 0.f);
  std::fill(m, m + g.Rp, -INFINITY);
  std::fill(l, l + g.Rp, 0.f);
}

bool cpu_has_avx512_bf16() { return isa().has(kAvx512 | kAvx512Bf16); }

void attend_chunk(bool use_avx512_bf16, const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0,
                  int j1, float* O, float* m, float* l, AttnScratch& scratch) {
  if (use_avx512_bf16)
    attend_chunk_avx512bf16(g, qp, kv, j0, j1, O, m, l, scratch);
  else
    attend_chunk_portable(g, qp, kv, j0, j1, O, m, l);
}

// Same math as the AVX-512 path (bf16 operands, fp32 accumulation, base-2 online softmax with bf16
// probabilities), one key at a time. For CPUs without AVX512-BF16.
void attend_chunk_portable(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                           float* O, float* m, float* l) {
  const int d = g.d, half = d / 2;
  std::vector<float> q(d), krow(d), vrow(d);
  for (int r = 0; r < g.R; ++r) {
    for (int i = 0; i < half; ++i) {
      const uint32_t pair = qp[size_t(i) * g.qld + r];
      q[2 * i] = bf16_to_f32(static_cast<uint16_t>(pair & 0xffff));
      q[2 * i + 1] = bf16_to_f32(static_cast<uint16_t>(pair >> 16));
    }
    float* o = O + size_t(r) * g.dp;
    for (int j = j0; j < j1; ++j) {
      const uint16_t* kr = j < kv.S ? kv.k_cache + size_t(j) * d
                           : j < kv.S + kv.S2 ? kv.k_mid + size_t(j - kv.S) * d
                                              : kv.k_own + size_t(j - kv.S - kv.S2) * d;
      const uint16_t* vr = j < kv.S ? kv.v_cache + size_t(j) * d
                           : j < kv.S + kv.S2 ? kv.v_mid + size_t(j - kv.S) * d
                                              : kv.v_own + size_t(j - kv.S - kv.S2) * d;
      float s = 0.f;
      for (int c = 0; c < d; ++c) s += q[c] * bf16_to_f32(kr[c]);
      s *= g.scale_log2;
      const float m_new = std::max(m[r], s);
      const float alpha = std::exp2(m[r] - m_new), p = std::exp2(s - m_new);
      const float pb = bf16_round(p);
      for (int c = 0; c < d; ++c) o[c] = o[c] * alpha + pb * bf16_to_f32(vr[c]);
      l[r] = l[r] * alpha + p;
      m[r] = m_new;
    }
  }
}

void merge_partials(const AttnGeometry& g, int n, const float* const* O, const float* const* m,
                    const float* const* l, int T, int group, int head0, int ld, float* out_f32, uint16_t* out_bf16) {
  std::vector<float> w(n), acc(g.d);
  for (int r = 0; r < g.R; ++r) {
    float mx = -INFINITY;
    for (int c = 0; c < n; ++c) mx = std::max(mx, m[c][r]);
    float denom = 0.f;
    for (int c = 0; c < n; ++c) {
      const float mc = m[c][r];
      w[c] = mc == -INFINITY ? 0.f : std::exp2(mc - mx);
      denom += w[c] * l[c][r];
    }
    const float inv = denom > 0.f ? 1.f / denom : 0.f;
    const float* o0 = O[0] + size_t(r) * g.dp;
    const float w0 = w[0] * inv;
#pragma omp simd
    for (int i = 0; i < g.d; ++i) acc[i] = w0 * o0[i];
    for (int c = 1; c < n; ++c) {
      const float* o = O[c] + size_t(r) * g.dp;
      const float wc = w[c] * inv;
#pragma omp simd
      for (int i = 0; i < g.d; ++i) acc[i] += wc * o[i];
    }
    const int hh = r / T, t = r % T;
    const size_t off = size_t(t) * ld + size_t(head0 + hh) * g.d;
    if (out_f32) std::copy(acc.begin(), acc.end(), out_f32 + off);
    if (out_bf16) store_bf16(acc.data(), g.d, out_bf16 + off);
  }
}

void merge_partials(const AttnGeometry& g, int n, const float* O, const float* m, const float* l, int T,
                    int group, int head0, int ld, float* out_f32, uint16_t* out_bf16) {
  const size_t ostride = size_t(g.Rp) * g.dp;
  std::vector<const float*> op(n), mp(n), lp(n);
  for (int c = 0; c < n; ++c) {
    op[c] = O + c * ostride;
    mp[c] = m + size_t(c) * g.Rp;
    lp[c] = l + size_t(c) * g.Rp;
  }
  merge_partials(g, n, op.data(), mp.data(), lp.data(), T, group, head0, ld, out_f32, out_bf16);
}

}  // namespace alpamayo::cpu
