// The op suite (op_suite.h): backend x op x format x kernel x shape, each kernel against the reference backend's op
// (src/ops/ops.h), with the bounds of the error model (error_model.h) where it has them and the op's own otherwise.
// Test names: <Backend>/Ops.MatchesTheReference/<op>_<format>_<kernel>_<shape>. A kernel this process cannot run
// (CPU, ALPAMAYO_CPU_ISA) is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/bfp.h"
#include "backends/reference/ops.h"
#include "backends/reference/ref_action_proj.h"
#include "backends/weight_formats.h"
#include "error_model.h"
#include "ops/op_suite.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "ops/cpu_kernels.h"
#endif

namespace alpamayo::opsuite {
namespace {

using conformance::error_model;
using conformance::ErrorModel;
using conformance::z_factor;

constexpr double kU32 = 0x1p-24;

// ---- The shapes, per op ----

OpShape linear_shape(int M, int K, int N, bool residual) {
  OpShape s;
  s.M = M, s.K = K, s.N = N, s.residual = residual;
  char b[64];  // snprintf: g++ 12 warns falsely (-Wrestrict) on chains of string +
  std::snprintf(b, sizeof b, "M%d_K%d_N%d%s", M, K, N, residual ? "_res" : "");
  s.name = b;
  return s;
}
OpShape attention_shape(int T, int Hq, int Hkv, int d, int P, int S, int S2, int chunks, bool spike = false) {
  OpShape s;
  s.T = T, s.Hq = Hq, s.Hkv = Hkv, s.d = d, s.P = P, s.S = S, s.S2 = S2, s.chunks = chunks, s.spike = spike;
  char b[96], mid[16] = "";
  if (S2) std::snprintf(mid, sizeof mid, "_mid%d", S2);
  std::snprintf(b, sizeof b, "T%d_Hq%d_Hkv%d_d%d_S%d%s_chunks%d%s", T, Hq, Hkv, d, S, mid, chunks,
                spike ? "_spike" : "");
  s.name = b;
  return s;
}
OpShape rows_shape(int M, int N) {
  OpShape s;
  s.M = M, s.N = N;
  char b[48];
  std::snprintf(b, sizeof b, "M%d_n%d", M, N);
  s.name = b;
  return s;
}

std::vector<OpShape> shape_table(Op op) {
  switch (op) {
    case Op::Linear:
      // M below, at and above the kernels' register tiles; odd K (down to 1), K across the block kernels' 256-row
      // blocks and the FMA kernels' 1024-row spans, K of the model's alignment (multiples of 16) with split-K; N
      // from 1, with 16- and 32-column tails; with and without a residual.
      return {linear_shape(1, 32, 16, false),  linear_shape(5, 64, 64, true),   linear_shape(5, 77, 100, false),
              linear_shape(7, 300, 64, true),  linear_shape(13, 33, 200, false), linear_shape(64, 200, 96, true),
              linear_shape(64, 520, 96, false), linear_shape(17, 2100, 33, true), linear_shape(70, 320, 200, true),
              linear_shape(64, 1536, 96, false), linear_shape(1, 1, 1, false),   linear_shape(3, 7, 15, true),
              linear_shape(130, 1000, 300, false), linear_shape(64, 1, 33, true)};
    case Op::Attention:
      // One and several chunks per head, no cache, GQA groups 1-3, odd head dims, a suffix segment, and a key far
      // above the running max (the kernels' fallback from the fused path).
      return {attention_shape(64, 4, 2, 128, 300, 290, 0, 1), attention_shape(64, 4, 2, 128, 300, 290, 0, 3),
              attention_shape(5, 4, 4, 64, 70, 0, 0, 1),      attention_shape(5, 6, 2, 48, 70, 70, 0, 2),
              attention_shape(3, 2, 1, 32, 10, 7, 0, 1),      attention_shape(64, 2, 1, 96, 130, 129, 0, 2),
              attention_shape(64, 4, 2, 128, 400, 390, 0, 1, true), attention_shape(7, 4, 2, 34, 50, 45, 0, 2),
              attention_shape(5, 4, 2, 64, 70, 40, 24, 2),    attention_shape(64, 4, 2, 128, 300, 200, 70, 3)};
    case Op::RmsNorm:
      return {rows_shape(5, 96), rows_shape(1, 7), rows_shape(3, 130), rows_shape(17, 2048)};
    case Op::QkNormRope: {
      std::vector<OpShape> v;
      for (const auto& [T, H, d] : {std::tuple{1, 1, 64}, std::tuple{5, 4, 128}, std::tuple{3, 2, 34}}) {
        OpShape s;
        s.T = T, s.Hq = H, s.d = d;
        char b[48];
        std::snprintf(b, sizeof b, "T%d_H%d_d%d", T, H, d);
        s.name = b;
        v.push_back(s);
      }
      return v;
    }
    case Op::SiluMul:
      return {rows_shape(3, 10), rows_shape(5, 96), rows_shape(64, 130)};
    case Op::ActionInProj:
    case Op::ActionOutProjEuler: {
      std::vector<OpShape> v;
      for (int B : {1, 3}) {
        OpShape s;
        s.B = B;
        s.name = "B" + std::to_string(B);
        v.push_back(s);
      }
      return v;
    }
  }
  return {};
}

// ---- The inputs ----

uint32_t seed_of(const std::string& s) {
  uint32_t h = 2166136261u;  // FNV-1a: the same inputs on every platform
  for (char c : s) h = (h ^ uint8_t(c)) * 16777619u;
  return h;
}

// Heavy-tailed weights with a few outliers and a band of tiny blocks (shared exponents where the bfp8_b block scale
// is a denormal), so every decoding path of the block formats is exercised.
std::vector<float> block_weights(int N, int K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(N) * K);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = 0.05f * nd(rng) * std::exp(0.5f * nd(rng));
    if (i % 997 == 3) w[i] *= 40.f;
  }
  for (int n = 0; n < std::min(N, 16); ++n)
    for (int k = 0; k < std::min(K, 5); ++k) w[size_t(n) * K + k] = std::ldexp(1.f + 0.37f * nd(rng), -123 + (n % 4));
  return w;
}

// A small action_in_proj / action_out_proj (the cuda kernels' test sizes): D 40, T 6, A 2, hidden 24, 2 layers.
void make_action_weights(OpData& d, std::mt19937& rng) {
  ExpertConfig& cfg = d.cfg;
  cfg.D = 40, cfg.T = 6, cfg.A = 2, cfg.ain_hidden = 24, cfg.ain_layers = 2, cfg.n_fourier = 20;
  const int h = cfg.ain_hidden, D = cfg.D, A = cfg.A, W0 = (A + 1) * cfg.n_fourier;
  d.store = std::make_shared<std::vector<std::vector<float>>>();
  d.store->reserve(16);
  auto view = [&](size_t n, float sd, float mean, std::vector<int64_t> shape) {
    std::normal_distribution<float> nd(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    d.store->push_back(std::move(v));
    return TensorView{DType::F32, std::move(shape), d.store->back().data(), "w"};
  };
  ActionInProjWeights& in = d.mw.action_in;
  in.linear_w = {view(size_t(h) * W0, 0.2f, 0, {h, W0}), view(size_t(h) * h, 0.2f, 0, {h, h}),
                 view(size_t(D) * h, 0.2f, 0, {D, h})};
  in.linear_b = {view(h, 0.1f, 0, {h}), view(h, 0.1f, 0, {h}), view(D, 0.1f, 0, {D})};
  in.norm_w = {view(h, 0.1f, 1, {h}), view(h, 0.1f, 1, {h})};
  in.ln_w = view(D, 0.1f, 1, {D});
  in.ln_b = view(D, 0.1f, 0, {D});
  d.mw.action_out.w = view(size_t(A) * D, 0.3f, 0, {A, D});
  d.mw.action_out.b = view(A, 0.1f, 0, {A});
}

OpData make_data(Op op, const std::string& format, const OpShape& s) {
  std::mt19937 rng(seed_of(std::string(ops::op_name(op)) + s.name));
  OpData d;
  switch (op) {
    case Op::Linear:
      d.x = rand_bf16(size_t(s.M) * s.K, 1.f, rng);
      d.W = format.rfind("bfp", 0) == 0 ? block_weights(s.N, s.K, rng) : rand_bf16(size_t(s.N) * s.K, 0.05f, rng);
      if (s.residual) d.h = rand_bf16(size_t(s.M) * s.N, 1.f, rng);
      break;
    case Op::Attention: {
      // Scores of a few units, so the softmax is neither flat nor one-hot.
      d.q = rand_bf16(size_t(s.T) * s.Hq * s.d, 1.5f, rng);
      d.k_own = rand_bf16(size_t(s.T) * s.Hkv * s.d, 1.f, rng), d.v_own = rand_bf16(d.k_own.size(), 1.f, rng);
      d.k_cache = rand_bf16(size_t(s.Hkv) * s.P * s.d, 1.f, rng), d.v_cache = rand_bf16(d.k_cache.size(), 1.f, rng);
      d.k_mid = rand_bf16(size_t(s.Hkv) * s.S2 * s.d, 1.f, rng), d.v_mid = rand_bf16(d.k_mid.size(), 1.f, rng);
      const int group = s.Hq / s.Hkv;
      if (s.spike)
        for (int h = 0; h < s.Hkv; ++h)
          for (int i = 0; i < s.d; ++i)
            d.k_own[(size_t(s.T - 1) * s.Hkv + h) * s.d + i] =
                bf16_round(32.f * d.q[(size_t(s.T - 1) * s.Hq + h * group) * s.d + i]);
      break;
    }
    case Op::RmsNorm:
      d.x = rand_bf16(size_t(s.M) * s.N, 2.f, rng), d.w = rand_bf16(s.N, 1.f, rng);
      break;
    case Op::QkNormRope:
      d.x = rand_bf16(size_t(s.T) * s.Hq * s.d, 1.f, rng), d.w = rand_bf16(s.d, 1.f, rng);
      d.cos = rand_bf16(size_t(s.T) * s.d, 1.f, rng), d.sin = rand_bf16(d.cos.size(), 1.f, rng);
      break;
    case Op::SiluMul: {
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      d.x.resize(size_t(s.M) * 2 * s.N);
      for (float& v : d.x) v = u(rng);
      break;
    }
    case Op::ActionInProj:
    case Op::ActionOutProjEuler: {
      make_action_weights(d, rng);
      const int rows = s.B * d.cfg.T;
      std::normal_distribution<float> nd(0.f, 1.f);
      d.x.resize(size_t(rows) * d.cfg.A);
      for (float& v : d.x) v = nd(rng);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      d.t.resize(s.B);
      for (float& v : d.t) v = u(rng);
      d.hidden.resize(size_t(rows) * d.cfg.D);
      for (float& v : d.hidden) v = nd(rng);
      d.dt = 0.1f;
      break;
    }
  }
  return d;
}

// What the format does to the reference's inputs, as the reference backend does it: block-format weights quantised
// (weight_formats.h), an int8 cache's key and value rows rounded (kv_int8.h). bf16 inputs are bf16-exact already;
// int8 weights and activations are the kernel's own rounding (the error model's sites).
void apply_format(Op op, const std::string& format, const OpShape& s, OpData& d) {
  if (op == Op::Linear && format.rfind("bfp", 0) == 0) {
    bfp::Format f;
    bfp::parse_format(format, &f);
    quantize_linear_transposed(f, d.W.data(), s.N, s.K);
  }
  if (op == Op::Attention && format == "int8")
    for (std::vector<float>* v : {&d.k_own, &d.v_own, &d.k_cache, &d.v_cache, &d.k_mid, &d.v_mid})
      ref::round_rows_s8(v->data(), int64_t(v->size() / s.d), s.d);
}

// ---- The reference ops (src/ops/ops.h) ----

std::vector<float> reference(Op op, const OpShape& s, const OpData& d) {
  std::vector<float> y;
  switch (op) {
    case Op::Linear:
      y.resize(size_t(s.M) * s.N);
      ref::matmul_nt(d.x.data(), s.M, s.K, d.W.data(), s.N, y.data());
      for (size_t i = 0; i < d.h.size(); ++i) y[i] += d.h[i];
      break;
    case Op::Attention: {
      y.resize(d.q.size());
      std::vector<ref::KeySegment> segs;
      if (s.S) segs.push_back({d.k_cache.data(), d.v_cache.data(), int64_t(s.P) * s.d, s.S});
      if (s.S2) segs.push_back({d.k_mid.data(), d.v_mid.data(), int64_t(s.S2) * s.d, s.S2});
      ref::attention(d.q.data(), d.k_own.data(), d.v_own.data(), segs, s.T, s.Hq, s.Hkv, s.d, y.data());
      break;
    }
    case Op::RmsNorm:
      y.resize(d.x.size());
      ref::rms_norm(d.x.data(), d.w.data(), s.M, s.N, d.eps, y.data());
      break;
    case Op::QkNormRope:
      y.resize(d.x.size());
      ref::rms_norm(d.x.data(), d.w.data(), s.T * s.Hq, s.d, d.eps, y.data());
      ref::rope_apply(y.data(), s.T, s.Hq, s.d, d.cos.data(), d.sin.data());
      break;
    case Op::SiluMul:
      y.resize(size_t(s.M) * s.N);
      for (int m = 0; m < s.M; ++m)
        for (int c = 0; c < s.N; ++c) {
          const float* row = d.x.data() + size_t(m) * 2 * s.N;
          y[size_t(m) * s.N + c] = ref::silu(row[c]) * row[s.N + c];
        }
      break;
    case Op::ActionInProj:
      y.resize(size_t(s.B) * d.cfg.T * d.cfg.D);
      ref::ActionInProj(d.cfg, d.mw.action_in).forward(d.x.data(), d.t.data(), s.B, y.data());
      break;
    case Op::ActionOutProjEuler: {  // [v, x + dt v]
      const int rows = s.B * d.cfg.T, n = rows * d.cfg.A;
      y.resize(2 * size_t(n));
      ref::ActionOutProj(d.mw.action_out).forward(d.hidden.data(), rows, y.data());
      for (int i = 0; i < n; ++i) y[n + i] = d.x[i] + d.dt * y[i];
      break;
    }
  }
  return y;
}

// ---- The bounds ----

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}
double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0 : std::sqrt(s / double(v.size()));
}

// Per element: |got - ref| <= bound; reports the worst element. Returns max |got - ref|.
double expect_elementwise(const std::vector<float>& got, const std::vector<float>& ref,
                          const std::vector<double>& bound, const std::string& at) {
  double worst = 0, md = 0;
  size_t wi = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - ref[i]);
    if (!(diff <= bound[i])) {
      ADD_FAILURE() << at << ": element " << i << " is " << got[i] << ", the reference " << ref[i] << ", bound "
                    << bound[i];
      return INFINITY;
    }
    md = std::max(md, diff);
    if (bound[i] > 0 && diff / bound[i] > worst) worst = diff / bound[i], wi = i;
  }
  std::printf("[ measured ] %s: max |d| %.2e, worst |d| / bound %.3f (element %zu)\n", at.c_str(), md, worst, wi);
  return md;
}

// linear: three bounds, each from a test this suite replaced or from the error model, none looser than before.
//  - bf16 and the block formats (operands exact): against the exact sum of the same products, fp32 accumulation in
//    any order: |y - exact| <= 2 K u32 sum_k |x w| (2x the worst case of a sequential sum), plus the residual add's
//    rounding.
//  - the error model (error_model.h) of one unit with the reduction K: rms(e) <= rho rms(r), max|e| <= z(n) rho
//    rms(r), r = x W^T; the sites: none for bf16 and the block formats (the reference multiplies the same
//    weights), int8: x per row (crest factor kKappaAct) and W as the format rounds it.
//  - bf16: max|e| <= 1e-4 max|r| (only summation order differs); int8: 3e-2 max|r| (two 8-bit roundings).
void expect_linear(const OpKernel& k, const OpShape& s, const OpData& rd, const std::vector<float>& got,
                   const std::vector<float>& ref, const std::string& at) {
  const size_t n = ref.size();
  std::vector<double> r(n), e(n);
  for (size_t i = 0; i < n; ++i) r[i] = double(ref[i]) - (rd.h.empty() ? 0.0 : rd.h[i]), e[i] = double(got[i]) - ref[i];
  const bool int8 = k.format == "int8";
  if (!int8) {
    std::vector<float> exact(n);
    std::vector<double> bound(n);
    for (int m = 0; m < s.M; ++m)
      for (int c = 0; c < s.N; ++c) {
        double sum = 0, mag = 0;
        for (int kk = 0; kk < s.K; ++kk) {
          const double p = double(rd.x[size_t(m) * s.K + kk]) * rd.W[size_t(c) * s.K + kk];
          sum += p, mag += std::fabs(p);
        }
        const size_t i = size_t(m) * s.N + c;
        const double h = rd.h.empty() ? 0.0 : rd.h[i];
        exact[i] = float(sum + h);
        bound[i] = 2.0 * s.K * kU32 * mag + kU32 * std::fabs(sum + h) + 1e-30;
      }
    // The exact sum itself rounded to fp32 once more: half an ulp.
    for (size_t i = 0; i < n; ++i) bound[i] += 0.5 * kU32 * std::fabs(double(exact[i]));
    expect_elementwise(got, exact, bound, at + " against the exact products");
  }
  std::vector<double> sites;
  if (int8) {
    sites = {conformance::eps_int8(conformance::kKappaAct), conformance::weight_format_error("int8", rd.W, s.N, s.K)};
  }
  const ErrorModel em = error_model(sites, {s.K});
  const double rho = em.rho(1), rr = rms(r), re = rms(e);
  double me = 0;
  for (double x : e) me = std::max(me, std::fabs(x));
  const double rmax = [&] {
    double m = 0;
    for (double x : r) m = std::max(m, std::fabs(x));
    return m;
  }();
  const double cur = int8 ? 3e-2 : 1e-4;
  std::printf("[ measured ] %s: rms(e) / rms(r) %.2e (model %.2e), max|e| / max|r| %.2e (bound %.0e)\n", at.c_str(),
              re / rr, rho, me / rmax, cur);
  EXPECT_LE(re, rho * rr) << at << ": rms error beyond the error model";
  EXPECT_LE(me, z_factor(n) * rho * rr) << at << ": largest error beyond the error model's z(n) rho rms(r)";
  EXPECT_LE(me, cur * rmax) << at;
}

void expect_close(const OpKernel& k, const OpShape& s, const OpData& rd, const std::vector<float>& got,
                  const std::vector<float>& ref, const std::string& at) {
  const size_t n = ref.size();
  std::vector<double> bound(n);
  if (k.max_rel > 0 && k.op != Op::Linear) {
    // action_out_proj_euler's two outputs [v, x + dt v] each relative to its own largest value.
    const size_t parts = k.op == Op::ActionOutProjEuler ? 2 : 1, len = n / parts;
    for (size_t p = 0; p < parts; ++p) {
      const std::vector<float> part(ref.begin() + p * len, ref.begin() + (p + 1) * len);
      std::fill(bound.begin() + p * len, bound.begin() + (p + 1) * len, k.max_rel * max_abs(part));
    }
    expect_elementwise(got, ref, bound, at);
    return;
  }
  switch (k.op) {
    case Op::Linear:
      expect_linear(k, s, rd, got, ref, at);
      return;
    case Op::Attention:
      ADD_FAILURE() << at << ": attention kernels carry their bound (OpKernel::max_rel)";
      return;
    case Op::RmsNorm:
      for (int m = 0; m < s.M; ++m) {
        double rmax = 0;
        for (int c = 0; c < s.N; ++c) rmax = std::max(rmax, std::fabs(double(ref[size_t(m) * s.N + c])));
        for (int c = 0; c < s.N; ++c) {
          const size_t i = size_t(m) * s.N + c;
          const double v = std::fabs(double(ref[i]));
          if (k.format == "f32")  // fp32 mean of squares in any order (n/2 ulps through the sqrt), a few products
            bound[i] = (s.N / 2.0 + 4.0) * kU32 * v + 1e-30;
          else if (k.format == "bf16")  // the bf16 output's rounding
            bound[i] = v * 0x1p-8 + 1e-6;
          else  // int8 output: half a step of max|row| / 127
            bound[i] = 0.5 * rmax / 127.0 * (1 + 0x1p-10) + 1e-6;
        }
      }
      break;
    case Op::QkNormRope:
      std::fill(bound.begin(), bound.end(), 1e-5 * max_abs(ref));
      break;
    case Op::SiluMul:
      // bf16: the output's rounding. fp32: exp_approx and the epilogue's order of products, relative 1e-6 (about 16
      // ulps; the bound of 1e-6 the outputs of magnitude <= 1 had).
      for (size_t i = 0; i < n; ++i) {
        const double v = std::fabs(double(ref[i]));
        bound[i] = k.format == "bf16" ? v * 0x1p-8 + 1e-6 : 1e-6 * std::max(1.0, v);
      }
      break;
    case Op::ActionInProj:
    case Op::ActionOutProjEuler: {
      // The error model of one unit: no rounding sites (fp32 on both sides), the trunk's reductions (the output
      // head's D among them).
      const int W0 = (rd.cfg.A + 1) * rd.cfg.n_fourier;
      const ErrorModel em = error_model({}, {W0, rd.cfg.ain_hidden, rd.cfg.ain_hidden, rd.cfg.D});
      std::vector<double> r(ref.begin(), ref.end()), e(n);
      for (size_t i = 0; i < n; ++i) e[i] = double(got[i]) - ref[i];
      const double rho = em.rho(1), rr = rms(r);
      std::printf("[ measured ] %s: rms(e) / rms(r) %.2e (model %.2e)\n", at.c_str(), rms(e) / rr, rho);
      EXPECT_LE(rms(e), rho * rr) << at;
      std::fill(bound.begin(), bound.end(), z_factor(n) * rho * rr);
      break;
    }
  }
  expect_elementwise(got, ref, bound, at);
}

// ---- The suite ----

TEST_P(Ops, MatchesTheReference) {
  const OpKernel& k = *GetParam().k;
  const OpShape& s = GetParam().shape;
  const std::string at = k.backend + " " + ops::op_name(k.op) + " " + k.format + " " + k.kernel + " " + s.name;
  if (const std::string why = k.unavailable(); !why.empty())
    GTEST_SKIP() << k.backend << " " << ops::op_name(k.op) << " kernel " << k.kernel << " (" << k.format
                 << ") skipped: " << why;
  if (k.refuses)
    if (const std::string why = k.refuses(s); !why.empty())
      GTEST_SKIP() << k.backend << " " << ops::op_name(k.op) << " kernel " << k.kernel << " (" << k.format
                   << ") skipped on " << s.name << ": " << why;
  const OpData d = make_data(k.op, k.format, s);
  OpData rd = d;
  apply_format(k.op, k.format, s, rd);
  std::vector<float> unrounded;
  if (k.reference_inputs) {
    if (k.print_unrounded) unrounded = reference(k.op, s, rd);
    k.reference_inputs(s, rd);
  }
  const std::vector<float> ref = reference(k.op, s, rd);
  const std::vector<float> got = k.run(s, d);
  ASSERT_EQ(got.size(), ref.size()) << at;
  const double md = [&] {
    double m = 0;
    for (size_t i = 0; i < ref.size(); ++i) m = std::max(m, std::fabs(double(got[i]) - ref[i]));
    return m;
  }();
  if (!unrounded.empty()) {  // what the kernel's own rounding costs against the exact inputs
    double mu = 0;
    for (size_t i = 0; i < ref.size(); ++i) mu = std::max(mu, std::fabs(double(got[i]) - unrounded[i]));
    std::printf("[ measured ] %s: max |out - oracle| = %.2e of the largest output; against the unrounded inputs %.2e\n",
                at.c_str(), md / max_abs(ref), mu / max_abs(unrounded));
  }
  expect_close(k, s, rd, got, ref, at);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Ops);

#ifdef ALPAMAYO_WITH_CPU_BACKEND
INSTANTIATE_TEST_SUITE_P(Cpu, Ops, ::testing::ValuesIn(cases(cpu_kernels::backend_ops())), case_name);

TEST(OpSuite, CpuCoversTheContract) { expect_covers_the_contract(cpu_kernels::backend_ops()); }
#endif

}  // namespace

std::vector<OpShape> shapes(Op op) { return shape_table(op); }

}  // namespace alpamayo::opsuite
