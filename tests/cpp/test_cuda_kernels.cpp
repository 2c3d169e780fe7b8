// The cuda backend's kernels, run from their own source on the host by the SIMT emulator
// (src/backends/cuda/simt_emu.h), against CPU references: split-KV attention with its merge, the skinny
// W8A16 / bf16 matmul with split-K, the layer row kernels, the action projections and the Euler update,
// and the cache scan / conversion. These run on every machine (no GPU needed); they check indexing,
// fragment layouts, masking and pipelines. The GPU itself is checked by the conformance suite.
#define ALPAMAYO_SIMT_EMU
#define ALP_ROW_THREADS 64  // fewer emulated threads; the kernels loop over any block width
#define ALP_KERNEL_NS emu
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "alpamayo/tensor.h"
#include "backends/cuda/action.cuh"
#include "backends/cuda/attention.cuh"
#include "backends/cuda/cache.cuh"
#include "backends/cuda/layer.cuh"
#include "backends/cuda/skinny_gemm.cuh"
#include "backends/reference/ops.h"
#include "backends/cpu/action_proj.h"
#include "model/fourier.h"

namespace alpamayo::cuda {
namespace {

std::mt19937 rng(7);

std::vector<float> randn(size_t n, float sd = 1.f, float mean = 0.f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
float e4m3_value(uint8_t q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, __NV_E4M3);
  return __half2float(__half(h));
}

// max |a - b| relative to max |b|, and whether every value is finite.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    mx = std::max(mx, double(std::fabs(a[i] - b[i])));
    ref = std::max(ref, double(std::fabs(b[i])));
  }
  return mx / std::max(ref, 1e-30);
}

struct AttnCase {
  int B, Hq, Hkv, d, T, P;
  std::vector<int> S;
  int chunk;  // keys per work item (a multiple of 64)
};

TEST(CudaKernels, SplitKvAttentionMatchesTheReference) {
  const std::vector<AttnCase> cases = {
      {1, 16, 8, 128, 64, 200, {137}, 64},  // the seed's heads, R = 128: one row tile, 4 items
      {2, 8, 2, 48, 40, 90, {0, 90}, 128},  // R = 160: two row tiles; a sample with no cache rows
      {1, 2, 2, 16, 5, 70, {70}, 64},       // MHA, d = 16, a key block straddling cache and own rows
  };
  for (const AttnCase& c : cases) {
    const int group = c.Hq / c.Hkv, R = group * c.T, tiles = (R + 127) / 128, Rp = tiles * 128;
    std::vector<float> q = from_bf16(to_bf16(randn(size_t(c.B) * c.Hq * c.T * c.d)));
    std::vector<float> kc = from_bf16(to_bf16(randn(size_t(c.B) * c.Hkv * c.P * c.d)));
    std::vector<float> vc = from_bf16(to_bf16(randn(size_t(c.B) * c.Hkv * c.P * c.d)));
    std::vector<float> ko = from_bf16(to_bf16(randn(size_t(c.B) * c.Hkv * c.T * c.d)));
    std::vector<float> vo = from_bf16(to_bf16(randn(size_t(c.B) * c.Hkv * c.T * c.d)));
    // Padding rows hold NaN: reading one poisons the output.
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < c.Hkv; ++h)
        for (int p = c.S[b]; p < c.P; ++p)
          for (int i = 0; i < c.d; ++i)
            kc[((size_t(b) * c.Hkv + h) * c.P + p) * c.d + i] = vc[((size_t(b) * c.Hkv + h) * c.P + p) * c.d + i] = NAN;
    std::vector<uint16_t> qb = to_bf16(q), kcb = to_bf16(kc), vcb = to_bf16(vc), kob = to_bf16(ko), vob = to_bf16(vo);

    std::vector<AttnItem> items;
    std::vector<int> range;
    for (int b = 0; b < c.B; ++b) {
      const int n = c.S[b] + c.T;
      range.push_back(int(items.size()));
      for (int j0 = 0; j0 < n; j0 += c.chunk) items.push_back({b, j0, std::min(n, j0 + c.chunk), c.S[b]});
      range.push_back(int(items.size()) - range[2 * b]);
    }
    std::vector<float> po(items.size() * c.Hkv * Rp * c.d, NAN), pm(items.size() * c.Hkv * Rp, NAN),
        pl(items.size() * c.Hkv * Rp, NAN), out(size_t(c.B) * c.T * c.Hq * c.d, NAN);
    AttnParams p;
    p.q = qb.data();
    p.k_cache = kcb.data();
    p.v_cache = vcb.data();
    p.k_own = kob.data();
    p.v_own = vob.data();
    p.items = items.data();
    p.item_range = range.data();
    p.part_o = po.data();
    p.part_m = pm.data();
    p.part_l = pl.data();
    p.n_items = int(items.size());
    p.B = c.B;
    p.Hkv = c.Hkv;
    p.group = group;
    p.T = c.T;
    p.P = c.P;
    p.d = c.d;
    p.R = R;
    p.Rp = Rp;
    const float scale_log2 = 1.4426950408889634f / std::sqrt(float(c.d));
    simt::launch(emu::attention_partial_k, dim3(p.n_items, c.Hkv, tiles), dim3(emu::kAttnThreads), emu::kAttnSmemBytes,
                 p, scale_log2);
    const int threads = c.B * c.Hkv * R * 32;
    simt::launch(emu::attention_merge_k, dim3((threads + 255) / 256), dim3(256), 0, p, Act::F32,
                 static_cast<void*>(out.data()));

    // Reference: per sample, q [T, Hq, d] token-major as ref::attention takes it.
    std::vector<float> want(out.size());
    for (int b = 0; b < c.B; ++b) {
      std::vector<float> qt(size_t(c.T) * c.Hq * c.d), kt(size_t(c.T) * c.Hkv * c.d), vt(kt.size());
      for (int h = 0; h < c.Hq; ++h)
        for (int t = 0; t < c.T; ++t)
          for (int i = 0; i < c.d; ++i)
            qt[(size_t(t) * c.Hq + h) * c.d + i] = q[((size_t(b) * c.Hq + h) * c.T + t) * c.d + i];
      for (int h = 0; h < c.Hkv; ++h)
        for (int t = 0; t < c.T; ++t)
          for (int i = 0; i < c.d; ++i) {
            kt[(size_t(t) * c.Hkv + h) * c.d + i] = ko[((size_t(b) * c.Hkv + h) * c.T + t) * c.d + i];
            vt[(size_t(t) * c.Hkv + h) * c.d + i] = vo[((size_t(b) * c.Hkv + h) * c.T + t) * c.d + i];
          }
      const size_t co = size_t(b) * c.Hkv * c.P * c.d;
      ref::attention(qt.data(), kt.data(), vt.data(), kc.data() + co, vc.data() + co, c.T, c.Hq, c.Hkv, c.d, c.P,
                     c.S[b], want.data() + size_t(b) * c.T * c.Hq * c.d, 1);
    }
    // Probabilities go through bf16 for the P V product: about 3 significant digits.
    EXPECT_LT(rel_err(out, want), 1e-2) << "B=" << c.B << " Hq=" << c.Hq << " d=" << c.d << " T=" << c.T;
  }
}

TEST(CudaKernels, SkinnyMatmulMatchesNaiveProducts) {
  for (bool fp8 : {false, true}) {
    const int M = 70, N = 200, K = 320;
    const std::vector<float> x = from_bf16(to_bf16(randn(size_t(M) * K)));
    const std::vector<uint16_t> xb = to_bf16(x);
    std::vector<float> w = randn(size_t(N) * K, 0.05f);
    std::vector<uint8_t> wbytes(size_t(N) * K * (fp8 ? 1 : 2));
    for (size_t i = 0; i < w.size(); ++i) {
      if (fp8) {
        wbytes[i] = emu::to_e4m3(w[i] * 8.f);
        w[i] = e4m3_value(wbytes[i]);
      } else {
        const uint16_t h = f32_to_bf16(w[i]);
        std::memcpy(&wbytes[2 * i], &h, 2);
        w[i] = bf16_to_f32(h);
      }
    }
    for (int splits_wanted : {1, 2, 5}) {
      SkinnyPlan p;
      p.N = N;
      p.K = K;
      p.M = M;
      p.fp8 = fp8;
      const int chunks = (K + emu::kKC - 1) / emu::kKC;
      p.chunks_per_split = (chunks + splits_wanted - 1) / splits_wanted;
      p.splits = (chunks + p.chunks_per_split - 1) / p.chunks_per_split;
      const int Mp = 80;
      const size_t stride = size_t(Mp) * N;
      std::vector<float> y(p.splits * stride, NAN);
      const dim3 grid((N + emu::kCh - 1) / emu::kCh, (M + emu::kTok - 1) / emu::kTok, p.splits);
      if (fp8)
        simt::launch(emu::skinny_gemm_k<true>, grid, dim3(emu::kGemmThreads), emu::GemmCfg<true>::kSmem, xb.data(),
                     wbytes.data(), y.data(), M, N, K, p.chunks_per_split, stride);
      else
        simt::launch(emu::skinny_gemm_k<false>, grid, dim3(emu::kGemmThreads), emu::GemmCfg<false>::kSmem, xb.data(),
                     wbytes.data(), y.data(), M, N, K, p.chunks_per_split, stride);
      std::vector<float> got(size_t(M) * N), want(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          float s = 0;
          for (int sp = 0; sp < p.splits; ++sp) s += y[sp * stride + size_t(m) * N + n];
          got[size_t(m) * N + n] = s;
          double acc = 0;
          for (int k = 0; k < K; ++k) acc += double(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
          want[size_t(m) * N + n] = float(acc);
        }
      EXPECT_LT(rel_err(got, want), 1e-5) << (fp8 ? "fp8" : "bf16") << " splits " << p.splits;
    }
  }
}

// A matmul output with two split-K partials and fp8 scales, and its dense value.
struct SplitOut {
  std::vector<float> y, rs, cs, dense;
  MatOut view;
  SplitOut(int M, int N, bool scaled) {
    const size_t stride = size_t(M) * N;
    y = randn(2 * stride);
    rs = randn(M, 0.1f, 1.f);
    cs = randn(N, 0.1f, 1.f);
    dense.resize(stride);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float v = y[size_t(m) * N + n] + y[stride + size_t(m) * N + n];
        if (scaled) v = v * rs[m] * cs[n];
        dense[size_t(m) * N + n] = v;
      }
    view = {y.data(), N, 2, stride, scaled ? rs.data() : nullptr, scaled ? cs.data() : nullptr};
  }
};

TEST(CudaKernels, ResidualRmsNormInAllOutputModes) {
  const int M = 5, D = 96;
  const std::vector<float> w = randn(D, 0.1f, 1.f);
  for (Act mode : {Act::BF16, Act::FP8, Act::F32}) {
    SplitOut y(M, D, mode == Act::FP8);
    std::vector<float> h = randn(size_t(M) * D), want_h = h;
    for (size_t i = 0; i < h.size(); ++i) want_h[i] += y.dense[i];
    std::vector<float> want(h.size());
    ref::rms_norm(want_h.data(), w.data(), M, D, 1e-6, want.data());
    std::vector<uint8_t> out(size_t(M) * D * 4);
    std::vector<float> out_rs(M);
    float* rs_out = mode == Act::FP8 ? y.rs.data() : out_rs.data();  // fp8: in place over the input's scales
    simt::launch(emu::residual_rmsnorm_k, dim3(M), dim3(emu::kRowThreads), 0, h.data(), y.view, w.data(), D, 1e-6f,
                 mode, static_cast<void*>(out.data()), rs_out);
    EXPECT_LT(rel_err(h, want_h), 1e-6);
    std::vector<float> got(h.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (mode == Act::F32) got[i] = reinterpret_cast<float*>(out.data())[i];
      if (mode == Act::BF16) got[i] = bf16_to_f32(reinterpret_cast<uint16_t*>(out.data())[i]);
      if (mode == Act::FP8) got[i] = e4m3_value(out[i]) * rs_out[i / D];
    }
    EXPECT_LT(rel_err(got, want), mode == Act::F32 ? 1e-6 : mode == Act::BF16 ? 4e-3 : 7e-2) << int(mode);
  }
}

TEST(CudaKernels, QkNormRopeWritesHeadsInAttentionLayouts) {
  const int B = 2, T = 3, Hq = 4, Hkv = 2, d = 48, M = B * T, heads = Hq + 2 * Hkv;
  SplitOut qkv(M, heads * d, true);
  const std::vector<float> qn = randn(d, 0.1f, 1.f), kn = randn(d, 0.1f, 1.f);
  const std::vector<float> cs = randn(size_t(M) * d), sn = randn(size_t(M) * d);
  std::vector<uint16_t> q(size_t(M) * Hq * d), k(size_t(M) * Hkv * d), v(size_t(M) * Hkv * d);
  const int blocks = (M * heads + emu::kHeadWarps - 1) / emu::kHeadWarps;
  simt::launch(emu::qk_norm_rope_k, dim3(blocks), dim3(emu::kHeadWarps * 32), emu::kHeadWarps * d * sizeof(float),
               qkv.view, qn.data(), kn.data(), cs.data(), sn.data(), M, T, Hq, Hkv, d, 1e-6f, q.data(), k.data(),
               v.data());
  std::vector<float> got, want;
  for (int m = 0; m < M; ++m)
    for (int hd = 0; hd < heads; ++hd) {
      std::vector<float> x(qkv.dense.begin() + size_t(m) * heads * d + hd * d,
                           qkv.dense.begin() + size_t(m) * heads * d + (hd + 1) * d);
      const int b = m / T, t = m % T;
      const uint16_t* dst;
      if (hd < Hq + Hkv) {
        ref::rms_norm(x.data(), (hd < Hq ? qn : kn).data(), 1, d, 1e-6, x.data());
        ref::rope_apply(x.data(), 1, 1, d, cs.data() + size_t(m) * d, sn.data() + size_t(m) * d);
        dst = hd < Hq ? &q[((size_t(b) * Hq + hd) * T + t) * d] : &k[((size_t(b) * Hkv + hd - Hq) * T + t) * d];
      } else {
        dst = &v[((size_t(b) * Hkv + hd - Hq - Hkv) * T + t) * d];
      }
      for (int i = 0; i < d; ++i) {
        got.push_back(bf16_to_f32(dst[i]));
        want.push_back(x[i]);
      }
    }
  EXPECT_LT(rel_err(got, want), 4e-3);
}

TEST(CudaKernels, SiluMulAndFp8RowQuantization) {
  const int M = 3, I = 80;
  for (Act mode : {Act::BF16, Act::FP8}) {
    SplitOut gu(M, 2 * I, mode == Act::FP8);
    std::vector<uint8_t> out(size_t(M) * I * 2);
    std::vector<float> rs(M);
    float* rs_out = mode == Act::FP8 ? gu.rs.data() : rs.data();
    simt::launch(emu::silu_mul_k, dim3(M), dim3(emu::kRowThreads), 0, gu.view, I, mode, static_cast<void*>(out.data()),
                 rs_out);
    std::vector<float> got, want;
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < I; ++i) {
        const float g = gu.dense[size_t(m) * 2 * I + i], u = gu.dense[size_t(m) * 2 * I + I + i];
        want.push_back(ref::silu(g) * u);
        got.push_back(mode == Act::BF16 ? bf16_to_f32(reinterpret_cast<uint16_t*>(out.data())[size_t(m) * I + i])
                                        : e4m3_value(out[size_t(m) * I + i]) * rs_out[m]);
      }
    EXPECT_LT(rel_err(got, want), mode == Act::BF16 ? 4e-3 : 7e-2);
  }
  // Weights: per-output-channel scales; the largest |w| of each row maps to 448 exactly.
  const int N = 4, K = 40;
  const std::vector<float> w = randn(size_t(N) * K);
  std::vector<uint8_t> q(w.size());
  std::vector<float> scale(N);
  simt::launch(emu::quantize_rows_k, dim3(N), dim3(emu::kRowThreads), 0, w.data(), K, q.data(), scale.data());
  for (int n = 0; n < N; ++n) {
    float amax = 0;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[size_t(n) * K + k]));
    EXPECT_FLOAT_EQ(scale[n], amax / 448.f);
    for (int k = 0; k < K; ++k)
      EXPECT_EQ(q[size_t(n) * K + k],
                uint8_t(__nv_cvt_float_to_fp8(w[size_t(n) * K + k] / scale[n], __NV_SATFINITE, __NV_E4M3)));
  }
}

TEST(CudaKernels, ActionProjectionsAndEulerUpdateMatchTheHost) {
  ExpertConfig cfg;
  cfg.D = 40;
  cfg.T = 6;
  cfg.A = 2;
  cfg.ain_hidden = 24;
  cfg.ain_layers = 2;
  cfg.n_fourier = 20;
  const int B = 2, M = B * cfg.T, F = cfg.n_fourier, h = cfg.ain_hidden, D = cfg.D, A = cfg.A, W0 = (A + 1) * F;
  std::vector<std::vector<float>> store;  // [0, 3) trunk weights, [3, 6) biases, 6-7 norms, 8-9 LayerNorm, 10-11 out
  auto view = [&](std::vector<float> v, std::vector<int64_t> shape) {
    store.push_back(std::move(v));
    return TensorView{DType::F32, std::move(shape), store.back().data(), "w"};
  };
  store.reserve(32);
  ModelWeights mw;
  mw.action_in.linear_w = {view(randn(size_t(h) * W0, 0.2f), {h, W0}), view(randn(size_t(h) * h, 0.2f), {h, h}),
                           view(randn(size_t(D) * h, 0.2f), {D, h})};
  mw.action_in.linear_b = {view(randn(h, 0.1f), {h}), view(randn(h, 0.1f), {h}), view(randn(D, 0.1f), {D})};
  mw.action_in.norm_w = {view(randn(h, 0.1f, 1.f), {h}), view(randn(h, 0.1f, 1.f), {h})};
  mw.action_in.ln_w = view(randn(D, 0.1f, 1.f), {D});
  mw.action_in.ln_b = view(randn(D, 0.1f), {D});
  mw.action_out.w = view(randn(size_t(A) * D, 0.3f), {A, D});
  mw.action_out.b = view(randn(A, 0.1f), {A});
  const HostProjections host(cfg, mw, false);

  const std::vector<float> x = randn(size_t(M) * A), times = {0.f, 0.25f, 0.5f};
  const int k = 1;
  std::vector<float> want(size_t(M) * D);
  const std::vector<float> t(B, times[k]);
  host.in(x.data(), t.data(), B, want.data());

  std::vector<float> freqs;
  for (int i = 0; i <= A; ++i) {
    const std::vector<float> f = fourier_freqs(F, cfg.max_freq, true);
    freqs.insert(freqs.end(), f.begin(), f.end());
  }
  std::vector<float> a(size_t(M) * 64), b(size_t(M) * 64), got(size_t(M) * D);
  simt::launch(emu::fourier_k, dim3((M * W0 + 255) / 256), dim3(256), 0, x.data(), times.data(), k, freqs.data(), M, A,
               F, a.data());
  int width = W0;
  for (int i = 0; i < 3; ++i) {
    if (i > 0)
      simt::launch(emu::rms_norm_k, dim3(M), dim3(emu::kRowThreads), 0, a.data(), store[6 + i - 1].data(), width, 1e-5f,
                   a.data());
    const int out = i < 2 ? h : D;
    const dim3 grid((out + emu::kTile - 1) / emu::kTile, (M + emu::kTile - 1) / emu::kTile);
    simt::launch(emu::linear_f32_k, grid, dim3(emu::kTile, emu::kTile), 0, a.data(), M, width, store[i].data(),
                 store[3 + i].data(), out, i < 2, b.data());
    std::swap(a, b);
    width = out;
  }
  simt::launch(emu::layer_norm_k, dim3(M), dim3(emu::kRowThreads), 0, a.data(), store[8].data(), store[9].data(), D,
               1e-5f, got.data());
  EXPECT_LT(rel_err(got, want), 1e-5);

  // action_out_proj and the Euler update, against the host loop's arithmetic.
  std::vector<float> xs = x, v(size_t(M) * A), xo(v.size()), vh(v.size());
  host.out(got.data(), M, vh.data());
  simt::launch(emu::out_proj_euler_k, dim3((M * A * 32 + 255) / 256), dim3(256), 0, got.data(), store[10].data(),
               store[11].data(), M, D, A, times.data(), k, xs.data(), v.data(), xo.data());
  EXPECT_LT(rel_err(v, vh), 1e-5);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(xs[i], x[i] + (times[k + 1] - times[k]) * v[i]);
    EXPECT_EQ(xo[i], xs[i]);
  }
}

TEST(CudaKernels, CacheScanFindsTheFirstNonFiniteValidValue) {
  const int B = 2, H = 3, P = 10, d = 8;
  const std::vector<int> S = {10, 4};
  for (CacheType t : {CacheType::F32, CacheType::F16, CacheType::BF16}) {
    std::vector<float> v = randn(size_t(B) * H * P * d);
    auto at = [&](int b, int h, int p, int i) -> float& { return v[((size_t(b) * H + h) * P + p) * d + i]; };
    at(1, 0, 5, 2) = NAN;        // padding of sample 1: ignored
    at(1, 2, 3, 7) = INFINITY;   // valid: found
    at(1, 2, 2, 0) = -INFINITY;  // valid and earlier: this one
    std::vector<uint8_t> bytes(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == CacheType::F32) std::memcpy(&bytes[4 * i], &v[i], 4);
      const uint16_t h16 = t == CacheType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      if (t != CacheType::F32) std::memcpy(&bytes[2 * i], &h16, 2);
    }
    unsigned long long first = ~0ull;
    simt::launch(emu::scan_k, dim3(2, B * H), dim3(256), 0, static_cast<const void*>(bytes.data()), t, H, P, d,
                 S.data(), &first);
    EXPECT_EQ(first, ((size_t(1) * H + 2) * P + 2) * d + 0);
    std::vector<uint16_t> conv(v.size(), 0);
    at(1, 2, 3, 7) = at(1, 2, 2, 0) = 0.f;
    simt::launch(emu::convert_k, dim3(2, B * H), dim3(256), 0, static_cast<const void*>(bytes.data()), t, H, P, d,
                 S.data(), conv.data());
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < H; ++hh)
        for (int p = 0; p < S[b]; ++p)
          for (int i = 0; i < d; ++i) {
            const size_t idx = ((size_t(b) * H + hh) * P + p) * d + i;
            if (!std::isfinite(bf16_to_f32(conv[idx]))) continue;
            const float src = t == CacheType::F32   ? v[idx]
                              : t == CacheType::F16 ? f16_to_f32(f32_to_f16(v[idx]))
                                                    : bf16_round(v[idx]);
            EXPECT_EQ(conv[idx], f32_to_bf16(src));
          }
  }
}

}  // namespace
}  // namespace alpamayo::cuda
