// kernel_check.h: the bounds a candidate kernel's output must meet against the portable kernel's, each derived below
// from the data and from the roundings a correct kernel may make (docs/CPU_BACKEND.md, "Accuracy check at the
// choice"). u = 2^-24 is fp32's unit roundoff, gamma_n = n u / (1 - n u) the bound on (1 + u)^n - 1 and on the
// relative error of any n-term fp32 sum of exact terms, whatever its order (Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., (3.4) and Lemma 3.1; with or without FMA).
#include "backends/cpu/kernel_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>

#include "alpamayo/tensor.h"

namespace alpamayo::cpu {
namespace {

constexpr double kU = 0x1p-24;
constexpr double kMinNormal = 0x1p-126;  // fp32's smallest normal number
double gamma(double n) { return n * kU / (1 - n * kU); }
// The bounds are themselves evaluated in double: sums of nonnegative terms, each within n 2^-53 relative (n <= 2^20
// here). This factor covers that and nothing else.
constexpr double kEval = 1 + 0x1p-30;

bool bf16_subnormal(uint16_t h) { return (h & 0x7f80u) == 0 && (h & 0x7fu) != 0; }

template <class T>
KernelAccuracy accuracy(const T* cand, const T* ref, const double* bound, size_t n) {
  KernelAccuracy a;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(cand[i]) - double(ref[i]));
    const double r = !std::isfinite(d) ? std::numeric_limits<double>::infinity()
                     : bound[i] > 0    ? d / bound[i]
                     : d == 0          ? 0.0
                                       : std::numeric_limits<double>::infinity();
    if (i == 0 || r > a.ratio) a = {r, d, bound[i], i};
  }
  return a;
}

}  // namespace

KernelAccuracy kernel_accuracy(const float* cand, const float* ref, const double* bound, size_t n) {
  return accuracy(cand, ref, bound, n);
}
KernelAccuracy kernel_accuracy(const double* cand, const double* ref, const double* bound, size_t n) {
  return accuracy(cand, ref, bound, n);
}

// bf16 matmuls. x_k and w_k are bf16 (8 significant bits), so each product x_k w_k is exact in fp32 unless it
// underflows. Every correct kernel adds the K products in fp32 in an order of its own (one FMA chain for the fp32
// kernels, pairs and then lanes for vdpbf16ps, oneDNN's blocks and AMX tiles): each result is then within
// gamma_K A of the exact sum, A = sum_k |x_k w_k|, for any order. Underflow: each of a kernel's at most 2K roundings
// (K products, K additions) loses less than 2^-126 when its result is below 2^-126, whether it is flushed to zero
// (vdpbf16ps and AMX flush denormal results) or gradual; a kernel that reads denormal operands as zero (vdpbf16ps,
// AMX) drops those products, at most F = sum of |x_k w_k| over the k with a subnormal operand. Both the candidate
// and portable_fma obey this, so per output
//   |y_c - y_p| <= 2 gamma_K A + 2 * 2K 2^-126 + F,
// with A and F summed in double from the same bf16 operands.
std::vector<double> matmul_bf16_bound(const uint16_t* x, const uint16_t* w, int M, int K, int N) {
  std::vector<float> ax(size_t(M) * K), aw(size_t(N) * K);
  bool subnormal = false;
  for (size_t i = 0; i < ax.size(); ++i) ax[i] = std::fabs(bf16_to_f32(x[i])), subnormal |= bf16_subnormal(x[i]);
  for (size_t i = 0; i < aw.size(); ++i) aw[i] = std::fabs(bf16_to_f32(w[i])), subnormal |= bf16_subnormal(w[i]);
  std::vector<double> b(size_t(M) * N);
  const double g = 2 * gamma(K), tiny = 4.0 * K * kMinNormal;
  for (int m = 0; m < M; ++m) {
    const float* xr = ax.data() + size_t(m) * K;
    for (int n = 0; n < N; ++n) {
      const float* wr = aw.data() + size_t(n) * K;
      double a = 0;
#pragma omp simd reduction(+ : a)
      for (int k = 0; k < K; ++k) a += double(xr[k]) * double(wr[k]);
      double f = 0;
      if (subnormal)
        for (int k = 0; k < K; ++k)
          if (bf16_subnormal(x[size_t(m) * K + k]) || bf16_subnormal(w[size_t(n) * K + k]))
            f += double(xr[k]) * double(wr[k]);
      b[size_t(m) * N + n] = (g * a + tiny + f) * kEval;
    }
  }
  return b;
}

Int8Sum int8_sum_of(const std::string& k) {
  if (k == "avx512_vnni" || k == "avx2_int8" || k == "amx_int8") return Int8Sum::Int32;
  if (k == "onednn") return Int8Sum::OnednnU8;
  return Int8Sum::Fp32Chain;
}

Int8Sums int8_sums(const uint8_t* xq, const int8_t* wq, int M, int K, int N) {
  Int8Sums s;
  s.M = M, s.K = K, s.N = N;
  s.S.resize(size_t(M) * N);
  s.A.resize(size_t(M) * N);
  s.C.resize(N);
  std::vector<int16_t> q(size_t(M) * K);
  for (size_t i = 0; i < q.size(); ++i) q[i] = int16_t(int(xq[i]) - 128);
  for (int n = 0; n < N; ++n) {
    int64_t c = 0;
    for (int k = 0; k < K; ++k) c += wq[size_t(n) * K + k];
    s.C[n] = 128 * c;
  }
  // int32 partial sums of at most 2^16 products of magnitude <= 128 * 127: no overflow.
  constexpr int kSpan = 1 << 16;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const int16_t* xr = q.data() + size_t(m) * K;
      const int8_t* wr = wq + size_t(n) * K;
      int64_t S = 0, A = 0;
      for (int k0 = 0; k0 < K; k0 += kSpan) {
        int32_t s32 = 0, a32 = 0;
        const int k1 = std::min(K, k0 + kSpan);
#pragma omp simd reduction(+ : s32, a32)
        for (int k = k0; k < k1; ++k) {
          const int32_t p = int32_t(xr[k]) * int32_t(wr[k]);
          s32 += p;
          a32 += p < 0 ? -p : p;
        }
        S += s32;
        A += a32;
      }
      s.S[size_t(m) * N + n] = S;
      s.A[size_t(m) * N + n] = A;
    }
  return s;
}

// int8 matmuls. q_x = u8 - 128 in [-127, 127] (quantize_rows) times q_w in [-127, 127] (quantize_weight_rows) is an
// exact integer below 2^14, so exact in fp32; S = sum_k q_x q_w, A = sum_k |q_x q_w|. Before the epilogue the kernels
// hold a = S up to:
// - fp32 FMA chains (avx512_fma, avx2_fma, portable_fma): gamma_K A, any order (as for bf16; no underflow).
// - an exact int32 sum rounded once to fp32 (avx512_vnni, whose u8 x s8 sum less 128 sum_k q_w is exact in int32,
//   avx2_int8 and amx_int8): u |S|.
// - oneDNN (int32 sums of u8 x s8 on VNNI or AMX; without VNNI it is not run, onednn_int8_refused): its output is
//   S + C rounded once (C = 128 sum_k q_w), and the epilogue subtracts C rounded to fp32 (col_correction) and rounds
//   the difference: |a - S| <= u(1 + u)(|S + C| + |C|) + u |S|.
// The epilogue (copy_rows) multiplies a by f = fl(ws[n] * rs[m]), the same fp32 value for every kernel (the same
// quantize_weight_rows scales and activation scales), and rounds once; the fp32 kernels' correction is 0, which
// subtracts exactly. So |fl(a_c f) - fl(a_p f)| <= |f| (|a_c - a_p| + u (|a_c| + |a_p|)), and with
// |a_c - S| <= e_c, |a_p - S| <= gamma_K A:
//   |y_c - y_p| <= |f| ((1 + u)(e_c + gamma_K A) + 2u |S|).
std::vector<double> matmul_int8_bound(const Int8Sums& s, const float* rs, const float* ws, Int8Sum cand) {
  std::vector<double> b(size_t(s.M) * s.N);
  const double g = gamma(s.K);
  for (int m = 0; m < s.M; ++m)
    for (int n = 0; n < s.N; ++n) {
      const size_t i = size_t(m) * s.N + n;
      const double S = std::fabs(double(s.S[i])), A = double(s.A[i]), C = std::fabs(double(s.C[n]));
      const double SC = std::fabs(double(s.S[i] + s.C[n]));
      const double ep = g * A;
      const double ec = cand == Int8Sum::Fp32Chain ? ep
                        : cand == Int8Sum::Int32   ? kU * S
                                                   : kU * (1 + kU) * (SC + C) + kU * S;
      const float f = ws[n] * rs[m];
      b[i] = std::fabs(double(f)) * ((1 + kU) * (ec + ep) + 2 * kU * S) * kEval;
    }
  return b;
}

AttnReference attention_reference(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int n) {
  const int d = g.d, R = g.R;
  const double c = g.scale_log2;  // the scale every kernel multiplies by (fp32), exactly
  AttnReference ref;
  ref.R = R, ref.d = d, ref.n = n, ref.int8 = kv.int8;
  // Keys and values as the kernels read them (bf16, or int8 times the row's scale: exact in double), [n][d].
  std::vector<double> K(size_t(n) * d), V(size_t(n) * d), vs(kv.int8 ? n : 0), s8(kv.int8 ? d : 0, 0.0);
  ref.vmax.assign(d, 0.0);
  double k1max = 0;
  for (int j = 0; j < n; ++j) {
    const int seg = j < kv.S ? 0 : j < kv.S + kv.S2 ? 1 : 2;
    const size_t i = size_t(j - (seg == 0 ? 0 : seg == 1 ? kv.S : kv.S + kv.S2));
    double* kr = K.data() + size_t(j) * d;
    double* vr = V.data() + size_t(j) * d;
    if (kv.int8) {
      const KeyRows::Int8Segment& sg = kv.i8[seg];
      vs[j] = sg.vs[i];
      for (int e = 0; e < d; ++e) {
        kr[e] = double(int(sg.k[i * d + e]) - 128) * sg.ks[i];
        vr[e] = double(sg.v[i * d + e]) * sg.vs[i];
        s8[e] += std::abs(int(sg.v[i * d + e]));
      }
    } else {
      const uint16_t* kb = seg == 0 ? kv.k_cache : seg == 1 ? kv.k_mid : kv.k_own;
      const uint16_t* vb = seg == 0 ? kv.v_cache : seg == 1 ? kv.v_mid : kv.v_own;
      for (int e = 0; e < d; ++e) kr[e] = bf16_to_f32(kb[i * d + e]), vr[e] = bf16_to_f32(vb[i * d + e]);
    }
    double k1 = 0;
    for (int e = 0; e < d; ++e) k1 += std::fabs(kr[e]), ref.vmax[e] = std::max(ref.vmax[e], std::fabs(vr[e]));
    k1max = std::max(k1max, k1);
  }
  ref.out.assign(size_t(R) * d, 0.0);
  ref.vbar.assign(size_t(R) * d, 0.0);
  ref.p15.assign(kv.int8 ? size_t(R) * d : 0, 0.0);
  ref.sigma.assign(R, 0.0);
  ref.qround.assign(R, 0.0);
  ref.norm.assign(R, 0.0);
  std::vector<double> q(d), s(n), sig(n);
  for (int r = 0; r < R; ++r) {
    double am = 0;
    for (int i = 0; i < d / 2; ++i) {
      const uint32_t pair = qp[size_t(i) * g.qld + r];
      q[2 * i] = bf16_to_f32(uint16_t(pair & 0xffff));
      q[2 * i + 1] = bf16_to_f32(uint16_t(pair >> 16));
      am = std::max({am, std::fabs(q[2 * i]), std::fabs(q[2 * i + 1])});
    }
    double mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
      const double* kr = K.data() + size_t(j) * d;
      double dot = 0, adot = 0;
#pragma omp simd reduction(+ : dot, adot)
      for (int e = 0; e < d; ++e) dot += q[e] * kr[e], adot += std::fabs(q[e] * kr[e]);
      s[j] = c * dot;
      sig[j] = c * adot;
      mx = std::max(mx, s[j]);
    }
    double L = 0, pvmax = 0, smax = 0;
    double* o = ref.out.data() + size_t(r) * d;
    double* vb = ref.vbar.data() + size_t(r) * d;
    for (int j = 0; j < n; ++j) {
      const double p = std::exp2(s[j] - mx);
      L += p;
      smax = std::max(smax, sig[j]);
      if (kv.int8) pvmax = std::max(pvmax, p * vs[j]);
      const double* vr = V.data() + size_t(j) * d;
#pragma omp simd
      for (int e = 0; e < d; ++e) o[e] += p * vr[e], vb[e] += p * std::fabs(vr[e]);
    }
    for (int e = 0; e < d; ++e) {
      o[e] /= L;
      vb[e] /= L;
      if (kv.int8) ref.p15[size_t(r) * d + e] = pvmax * s8[e] / L;
    }
    ref.sigma[r] = smax;
    ref.qround[r] = c * am / 254 * k1max;
    ref.norm[r] = L * std::exp2(mx);
  }
  return ref;
}

namespace {

// The relative error of 2^x from the kernels' polynomial of degree D on f = x - round(x), |f| <= 1/2: the Taylor
// polynomial of e^t, t = f ln2, |t| <= h = ln2 / 2, whose remainder is e^xi t^(D+1) / (D+1)! with xi between 0 and
// t, so at most e^h h^(D+1) / (D+1)! relative to e^t; plus the fp32 coefficients' rounding and D FMA steps (Horner),
// each within u of partial sums bounded by e^h, against e^t >= e^-h: 2 (gamma_D + u). f is exact, and so is the
// scaling by 2^n in the normal range. Degree 3: 8.5e-4 (the polynomial's own maximum is 7.9e-4, at f = -1/2);
// degree 6: 1.0e-6, mostly the rounding.
double poly_exp2_error(int D) {
  const double h = std::log(2.0) / 2;
  double t = std::exp(h);
  for (int k = 1; k <= D + 1; ++k) t *= h / k;
  return t + 2 * (gamma(D) + kU);
}

// What one attention kernel rounds (kernel_check.h; the derivation at attention_bound).
struct AttnRounding {
  double rho = 0;        // the probabilities' rounding for P.V (relative)
  double eps_p = 0;      // the exponential's relative error for the probabilities
  double eps_alpha = 0;  // ... and for the rescale factors
  double rescales = 0;   // how many rescales one key's term may pass
  bool int8_queries = false, p15 = false;
};

AttnRounding attention_rounding(AttnKernel k, int n) {
  // The blocked kernels: a first block of 16 keys, then blocks of kKeyBlock, one rescale at most per block
  // (amx_bf16's blocks of kAmxKeyBlock rescale less often: this count bounds it too).
  const double blocks = n <= 16 ? 1 : 1 + std::ceil(double(n - 16) / kKeyBlock);
  AttnRounding a;
  switch (k) {
    case AttnKernel::Portable:
      // std::exp2 per key for p and for the rescale (glibc's exp2f: 0.502 ulp documented; one ulp allowed), p
      // rounded to bf16 for O (2^-8 relative, round to nearest even), a rescale at every new maximum.
      a = {0x1p-8, 0x1p-23, 0x1p-23, double(n)};
      break;
    case AttnKernel::Avx512Bf16:  // bf16 probabilities (cvtne2ps_pbh, to nearest even); degree 3 fused, 4 exact
      a = {0x1p-8, poly_exp2_error(3), poly_exp2_error(6), blocks};
      break;
    case AttnKernel::Avx512Fma:
    case AttnKernel::Avx2Fma:  // fp32 probabilities, degree 6 everywhere
      a = {0, poly_exp2_error(6), poly_exp2_error(6), blocks};
      break;
    case AttnKernel::Avx512Vnni:  // int8 queries, 15-bit p * vs (absolute, below), degree 3 fused, 4 exact
      a = {0, poly_exp2_error(3), poly_exp2_error(6), blocks, true, true};
      break;
    case AttnKernel::AmxBf16:  // bf16 probabilities (times an int8 cache's value scales); its fitted cubic
                               // (exp2_p3_ps, 7.5e-5 plus rounding) is within degree 3's bound
      a = {0x1p-8, poly_exp2_error(3), poly_exp2_error(6), blocks};
      break;
  }
  return a;
}

// E_k per element and the relative bound on the normaliser for kernel k (attention_bound).
void attention_errors(const AttnReference& ref, AttnKernel k, std::vector<double>& e, std::vector<double>& en) {
  const AttnRounding a = attention_rounding(k, ref.n);
  const int R = ref.R, d = ref.d, n = ref.n;
  e.assign(size_t(R) * d, 0.0);
  en.assign(R, 0.0);
  for (int r = 0; r < R; ++r) {
    const double delta = gamma(d + 10) * 2 * ref.sigma[r] + (a.int8_queries ? (1 + gamma(8)) * ref.qround[r] : 0);
    const double grow = std::exp2(delta) * (1 + a.eps_p) * std::pow(1 + a.eps_alpha, a.rescales) *
                        std::pow(1 + kU, 2.0 * n + 16);
    const double beta = grow - 1, alpha = grow * (1 + a.rho) - 1;
    for (int c = 0; c < d; ++c) {
      const size_t i = size_t(r) * d + c;
      double v = alpha * ref.vbar[i] + beta * std::fabs(ref.out[i]) + 4.0 * n * kMinNormal * ref.vmax[c];
      if (a.p15) v += (1 + alpha) * ref.p15[i] / 65534;
      e[i] = v / (1 - beta);
    }
    en[r] = beta + 2.0 * n * kMinNormal / (1 - beta);
  }
}

}  // namespace

// Attention. Per query row, with the exact logits s_j = c q.k_j (base 2, c = log2(e) / sqrt(d) as the kernels' fp32
// scale; q, k_j, v_j as the kernels read them: bf16, or an int8 cache's values times their row's scale),
// P_j = 2^(s_j - max s) and L = sum_j P_j, the exact output is o = sum_j P_j v_j / L (per column; attention_reference
// computes it in double). A kernel's O and l are sum_j P_j (1 + a_j) v_j and sum_j P_j (1 + b_j) up to one common
// factor (its running maximum's), which cancels in O / l; a_j and b_j collect every relative error of key j's weight.
// With |a_j| <= alpha, |b_j| <= beta:
//   |O/l - o| = |sum_j P_j a_j v_j - o sum_j P_j b_j| / sum_j P_j (1 + b_j) <= (alpha vbar + beta |o|) / (1 - beta),
// vbar = sum_j P_j |v_j| / L. 1 + b_j is a product of (1 + a_j the same times 1 + rho, since every kernel's l adds
// the unrounded probabilities):
// - 2^delta for the logit's error delta. The score is a d-term fp32 dot product (bf16 products exact; an int8 cache's
//   widened rows and their products one rounding each), multiplied by c and reduced by the running maximum (one
//   rounding each, the maximum being a computed score); the rescales' arguments m_old - m_new, each rounded, add up to
//   the maximum's rise, at most 2 sigma_max: |delta| <= gamma_(d+10) 2 sigma_max, sigma_j = c sum_i |q_i k_ji| and
//   sigma_max its largest over the keys. avx512_vnni rounds the queries to int8 per row (scale
//   a / 127, a = max_i |q_i|): each q_i off by at most a / 254 (and 2u |q_i| for the fp32 division and product, within
//   the gamma term), so its logits by at most c (a / 254) sum_i |k_ji| more, times 1 + gamma_8 for the rounding of its
//   scale products.
// - 1 + eps_p for the exponential: std::exp2 for portable, the kernels' polynomials (poly_exp2_error).
// - (1 + eps_alpha)^rescales for the rescale factors 2^(m_old - m_new) a term is multiplied by after it joined: one
//   per new maximum in portable (up to n), one per key block in the blocked kernels.
// - (1 + u)^(2n + 16) for fp32 arithmetic: a term passes at most one multiplication and one addition per later key
//   (portable's O * alpha + p v and l * alpha + p, a block's sums, the rescales), plus a few fixed roundings (widening
//   an int8 row, p * vs, int32 to fp32, the scales).
// - 1 + rho for the probabilities' rounding for P.V: bf16 (2^-8) in portable and avx512_bf16, none in the fp32
//   kernels. avx512_vnni instead rounds p vs to 15 bits against the largest p vs of its row and block, an absolute
//   error of half a step per key: with that largest at most (1 + alpha) max_j P_j vs_j relative to L, O / l moves by at
//   most (1 + alpha) max_j (P_j vs_j) sum_j |v8_j| / (65534 L (1 - beta)) per column (v8 the int8 values).
// - underflow: a probability or product below 2^-126 may be lost (vdpbf16ps flushes, the AVX2 exp2 clamps), at most
//   2^-126 max_j |v_j| for each of <= 4n of them, against l >= 1 - beta (the key at the running maximum weighs 1).
// Candidate and portable each obey theirs: |o_c - o_p| <= E_c + E_p. The normalisers l 2^m both estimate
// sum_j 2^s_j = L 2^(max s), each within beta (plus 2n 2^-126 of underflow against l >= 1 - beta), and are compared
// as such: a kernel's running maximum need not be the maximum (the fused blocks keep it fixed), their product is.
AttnBound attention_bound(const AttnReference& ref, AttnKernel cand) {
  std::vector<double> ec, enc, ep, enp;
  attention_errors(ref, cand, ec, enc);
  attention_errors(ref, AttnKernel::Portable, ep, enp);
  AttnBound b;
  b.out.resize(ec.size());
  b.norm.resize(enc.size());
  for (size_t i = 0; i < ec.size(); ++i) b.out[i] = (ec[i] + ep[i]) * kEval;
  for (size_t r = 0; r < enc.size(); ++r) b.norm[r] = (enc[r] + enp[r]) * ref.norm[r] * kEval;
  return b;
}

std::string accuracy_summary(const std::string& yardstick, const std::string& shape,
                             const std::vector<std::pair<std::string, double>>& ratios) {
  std::string s = "checked against " + yardstick + " on " + shape;
  if (ratios.empty()) return s + ": none within its bound";
  s += ", worst |d| / bound:";
  for (size_t i = 0; i < ratios.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s %s %.2g", i ? "," : "", ratios[i].first.c_str(), ratios[i].second);
    s += buf;
  }
  return s;
}

std::string accuracy_failure(const std::string& kernel, const KernelAccuracy& a, const std::string& where,
                             const std::string& yardstick, const std::string& shape) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " |d| %.3g > bound %.3g at ", a.diff, a.bound);
  char times[48];
  std::snprintf(times, sizeof times, " (%.3g times the bound)", a.ratio);
  return kernel + buf + where + " against " + yardstick + " on " + shape + times;
}

namespace {
std::mutex perturb_mu;
std::map<std::string, double> perturb;  // "op=kernel" -> relative
}  // namespace

void set_kernel_check_perturbation_for_testing(const std::string& op, const std::string& kernel, double relative) {
  std::lock_guard<std::mutex> lk(perturb_mu);
  if (relative == 0) perturb.erase(op + "=" + kernel);
  else perturb[op + "=" + kernel] = relative;
}

double kernel_check_perturbation(const std::string& op, const std::string& kernel) {
  std::lock_guard<std::mutex> lk(perturb_mu);
  const auto it = perturb.find(op + "=" + kernel);
  return it == perturb.end() ? 0.0 : it->second;
}

std::string kernel_check_perturbations(const std::string& op) {
  std::lock_guard<std::mutex> lk(perturb_mu);
  std::string s;
  for (const auto& [k, v] : perturb)
    if (k.compare(0, op.size() + 1, op + "=") == 0) s += k + ":" + std::to_string(v) + ";";
  return s;
}

}  // namespace alpamayo::cpu
