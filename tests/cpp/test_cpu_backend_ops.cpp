// Op-level tests of the cpu backend's kernels against alpamayo::ref ops (the fp32 oracle).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/attention/attention.h"
#include "backends/kv_int8.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/attention/kv_quant.h"
#include "backends/cpu/matmul/onednn_matmul.h"
#include "backends/cpu/runtime/thread_pool.h"
#include "backends/reference/ops.h"

namespace alpamayo::cpu {
namespace {

// Values exactly representable in bf16, so both sides see identical operands.
std::vector<float> rand_bf16(size_t n, float sd, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(nd(rng));
  return v;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

double max_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

struct AttnCase {
  int T, Hq, Hkv, d, P, S, chunks;
  bool spike = false;  // last own key aligned with a query: scores far above the running max
};

// Every attention kernel on a bf16 and on an int8 cache; one this machine (or ALPAMAYO_CPU_ISA) cannot run, or that
// does not read that cache, is skipped, with the reason.
struct KernelCache {
  AttnKernel kernel;
  bool int8;
};
// The kernels with each cache they read: avx512_bf16 reads bf16 only, avx512_vnni int8 only, the others both.
std::vector<KernelCache> kernel_caches() {
  std::vector<KernelCache> v;
  for (bool int8 : {false, true})
    for (AttnKernel k : kAttnKernels)
      if (!(k == AttnKernel::Avx512Bf16 && int8) && !(k == AttnKernel::Avx512Vnni && !int8)) v.push_back({k, int8});
  return v;
}
class AttentionKernel : public ::testing::TestWithParam<std::tuple<AttnCase, KernelCache>> {};

TEST_P(AttentionKernel, MatchesReference) {
  const auto [c, kc_] = GetParam();
  const AttnKernel kernel = kc_.kernel;
  const bool int8 = kc_.int8;
  if (const std::string why = attn_kernel_unavailable(kernel, int8); !why.empty())
    GTEST_SKIP() << "attention kernel " << attn_kernel_name(kernel) << (int8 ? " (int8 cache)" : "")
                 << " skipped: " << why;
  std::mt19937 rng(7);
  const int group = c.Hq / c.Hkv;
  // Scores of a few units so the softmax is neither flat nor one-hot.
  auto q = rand_bf16(size_t(c.T) * c.Hq * c.d, 1.5f, rng), ko = rand_bf16(size_t(c.T) * c.Hkv * c.d, 1.f, rng),
             vo = rand_bf16(size_t(c.T) * c.Hkv * c.d, 1.f, rng), kc = rand_bf16(size_t(c.Hkv) * c.P * c.d, 1.f, rng),
             vc = rand_bf16(size_t(c.Hkv) * c.P * c.d, 1.f, rng);
  if (c.spike)  // exercises the kernel's fallback from the fused path to the exact block
    for (int h = 0; h < c.Hkv; ++h)
      for (int i = 0; i < c.d; ++i)
        ko[(size_t(c.T - 1) * c.Hkv + h) * c.d + i] =
            bf16_round(32.f * q[(size_t(c.T - 1) * c.Hq + h * group) * c.d + i]);
  // An int8 cache: every key and value row quantised (kv_int8.h); the oracle attends to the dequantised rows.
  std::vector<uint8_t> ko8(ko.size()), kc8(kc.size());
  std::vector<int8_t> vo8(vo.size()), vc8(vc.size());
  std::vector<float> kos(ko.size() / c.d), vos(kos.size()), kcs(kc.size() / c.d), vcs(kcs.size());
  if (int8) {
    auto quantise = [&](std::vector<float>& k, std::vector<float>& v, uint8_t* k8, int8_t* v8, float* ks, float* vs) {
      for (size_t r = 0; r < k.size() / c.d; ++r) {
        ks[r] = store_int8_key_row(k.data() + r * c.d, c.d, k8 + r * c.d);
        vs[r] = store_int8_value_row(v.data() + r * c.d, c.d, v8 + r * c.d);
        for (int i = 0; i < c.d; ++i) {
          k[r * c.d + i] = float(int(k8[r * c.d + i]) - 128) * ks[r];
          v[r * c.d + i] = float(v8[r * c.d + i]) * vs[r];
        }
      }
    };
    quantise(ko, vo, ko8.data(), vo8.data(), kos.data(), vos.data());
    quantise(kc, vc, kc8.data(), vc8.data(), kcs.data(), vcs.data());
  }
  std::vector<float> ref(q.size());
  ref::attention(q.data(), ko.data(), vo.data(), kc.data(), vc.data(), c.T, c.Hq, c.Hkv, c.d, c.P, c.S, ref.data());
  // avx512_vnni also rounds each query row to int8 (its scale: the row's largest |q| / 127, as kv_int8.h): its
  // oracle attends with those queries; what that rounding costs against the exact queries is printed.
  std::vector<float> ref_exact_q;
  if (kernel == AttnKernel::Avx512Vnni) {
    ref_exact_q = ref;
    std::vector<int8_t> q8(c.d);
    for (size_t r = 0; r < q.size() / c.d; ++r)
      dequantize_row_s8(q8.data(), quantize_row_s8(q.data() + r * c.d, c.d, q8.data()), c.d, q.data() + r * c.d);
    ref::attention(q.data(), ko.data(), vo.data(), kc.data(), vc.data(), c.T, c.Hq, c.Hkv, c.d, c.P, c.S, ref.data());
  }

  const AttnGeometry g = AttnGeometry::make(c.d, group, c.T);
  AttnScratch scratch;
  scratch.resize(g, attn_kernel_is_fp32(kernel), int8);
  std::vector<float> out(q.size(), NAN);
  auto to_bf16 = [](const float* x, size_t n) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(x[i]);
    return v;
  };
  for (int h = 0; h < c.Hkv; ++h) {
    AlignedBuf<uint32_t> qp(size_t(c.d / 2) * g.Rp);
    for (int hh = 0; hh < group; ++hh)
      for (int t = 0; t < c.T; ++t)
        for (int i = 0; i < c.d / 2; ++i) {
          const float* x = q.data() + (size_t(t) * c.Hq + h * group + hh) * c.d;
          qp[size_t(i) * g.Rp + hh * c.T + t] = f32_to_bf16(x[2 * i]) | (uint32_t(f32_to_bf16(x[2 * i + 1])) << 16);
        }
    std::vector<float> kown(size_t(c.T) * c.d), vown(kown.size()), kos_h(c.T), vos_h(c.T);
    std::vector<uint8_t> kown8(kown.size());
    std::vector<int8_t> vown8(kown.size());
    for (int t = 0; t < c.T; ++t) {
      const size_t src = size_t(t) * c.Hkv + h;
      for (int i = 0; i < c.d; ++i) {
        kown[size_t(t) * c.d + i] = ko[src * c.d + i];
        vown[size_t(t) * c.d + i] = vo[src * c.d + i];
        kown8[size_t(t) * c.d + i] = ko8[src * c.d + i];
        vown8[size_t(t) * c.d + i] = vo8[src * c.d + i];
      }
      kos_h[t] = kos[src];
      vos_h[t] = vos[src];
    }
    const auto kcb = to_bf16(kc.data() + size_t(h) * c.P * c.d, size_t(c.P) * c.d),
               vcb = to_bf16(vc.data() + size_t(h) * c.P * c.d, size_t(c.P) * c.d), kob = to_bf16(kown.data(), kown.size()),
               vob = to_bf16(vown.data(), vown.size());
    KeyRows kv;
    kv.k_cache = kcb.data();
    kv.v_cache = vcb.data();
    kv.S = c.S;
    kv.k_own = kob.data();
    kv.v_own = vob.data();
    if (int8) {
      const size_t off = size_t(h) * c.P;
      kv.int8 = true;
      kv.i8[0] = {kc8.data() + off * c.d, vc8.data() + off * c.d, kcs.data() + off, vcs.data() + off};
      kv.i8[2] = {kown8.data(), vown8.data(), kos_h.data(), vos_h.data()};
    }
    const int n = c.S + c.T;
    AlignedBuf<float> O(size_t(c.chunks) * g.Rp * g.dp), m(size_t(c.chunks) * g.Rp), l(size_t(c.chunks) * g.Rp);
    for (int ch = 0; ch < c.chunks; ++ch) {
      float* Oc = O.data() + size_t(ch) * g.Rp * g.dp;
      init_partial(g, Oc, m.data() + ch * g.Rp, l.data() + ch * g.Rp);
      attend_chunk(kernel, g, qp.data(), kv, n * ch / c.chunks, n * (ch + 1) / c.chunks, Oc, m.data() + ch * g.Rp,
                   l.data() + ch * g.Rp, scratch);
    }
    merge_partials(g, c.chunks, O.data(), m.data(), l.data(), c.T, group, h * group, c.Hq * c.d, out.data(), nullptr);
  }
  // bf16 probabilities (avx512_bf16, portable) differ from the oracle by their rounding: relative 2^-9 per
  // weight, averaging out over keys; measured <= 0.1% of the largest output, bound 0.5%. The fp32 kernels
  // differ by summation order and the exp2 polynomial only: bound 0.01%.
  // avx512_vnni rounds the probabilities (times the value scales) to 15 bits per row and block: measured <= 2.1e-4
  // of the largest output, bound 1e-3.
  const double bound = kernel == AttnKernel::Avx512Vnni ? 1e-3 : attn_kernel_is_fp32(kernel) ? 1e-4 : 5e-3;
  const double err = max_diff(out.data(), ref.data(), ref.size());
  std::printf("[ measured ] %s%s: max |out - oracle| = %.2e of the largest output", attn_kernel_name(kernel),
              int8 ? " (int8 cache)" : "", err / max_abs(ref));
  if (!ref_exact_q.empty())
    std::printf("; against exact queries %.2e", max_diff(out.data(), ref_exact_q.data(), ref.size()) / max_abs(ref));
  std::printf("\n");
  EXPECT_LE(err, bound * max_abs(ref)) << attn_kernel_name(kernel);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionKernel,
    ::testing::Combine(::testing::Values(AttnCase{64, 4, 2, 128, 300, 290, 1}, AttnCase{64, 4, 2, 128, 300, 290, 3},
                                         AttnCase{5, 4, 4, 64, 70, 0, 1}, AttnCase{5, 6, 2, 48, 70, 70, 2},
                                         AttnCase{3, 2, 1, 32, 10, 7, 1}, AttnCase{64, 2, 1, 96, 130, 129, 2},
                                         AttnCase{64, 4, 2, 128, 400, 390, 1, true},
                                         AttnCase{7, 4, 2, 34, 50, 45, 2}),
                       ::testing::ValuesIn(kernel_caches())),
    [](const auto& info) {
      const AttnCase& c = std::get<0>(info.param);
      return std::string(attn_kernel_name(std::get<1>(info.param).kernel)) + "_T" + std::to_string(c.T) + "_Hq" +
             std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_d" + std::to_string(c.d) + "_S" +
             std::to_string(c.S) + "_chunks" + std::to_string(c.chunks) + (c.spike ? "_spike" : "") +
             (std::get<1>(info.param).int8 ? "_int8" : "");
    });

class Matmul : public ::testing::TestWithParam<std::tuple<WeightType, int, int, int>> {};

TEST_P(Matmul, MatchesReference) {
  const auto [wt, M, K, N] = GetParam();
  if (wt == WeightType::INT8 && !onednn_int8_refused().empty())
    GTEST_SKIP() << "the cpu backend never runs it here: " << onednn_int8_refused();
  std::mt19937 rng(3);
  const auto x = rand_bf16(size_t(M) * K, 1.f, rng), W = rand_bf16(size_t(N) * K, 0.05f, rng);
  std::vector<float> ref(size_t(M) * N), y(size_t(M) * (N + 3), NAN);
  ref::matmul_nt(x.data(), M, K, W.data(), N, ref.data());
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  OnednnPrimitives kernels(eng);
  ScopedOmpThreads one(1);
  OnednnLinear lin;
  try {
    lin.pack(kernels, wt, K, N, W.data(), 7, N + 3);  // packed for another M, planned for M below
  } catch (const alpamayo::Error& e) {
    ASSERT_FALSE(isa().has(kAvx512)) << e.what();  // oneDNN 2.6 has bf16 and int8 matmuls wherever AVX-512 runs
    GTEST_SKIP() << e.what();
  }
  const OnednnPlan plan = lin.plan(kernels, M, N + 3);
  AlignedBuf<uint8_t> scratch(plan.scratch_bytes() + 1);
  std::vector<float> rs(M, 1.f);
  if (wt == WeightType::BF16) {
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    lin.run(st, plan, xb.data(), y.data(), scratch.data());
  } else {
    std::vector<uint8_t> xq(x.size());
    quantize_rows(x.data(), 0, M, K, xq.data(), rs.data());
    lin.run(st, plan, xq.data(), y.data(), scratch.data());
  }
  const float *corr = lin.col_correction(), *cs = lin.col_scale();
  ASSERT_EQ(corr == nullptr, wt == WeightType::BF16);
  double err = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const double v = (double(y[size_t(m) * (N + 3) + n]) - (corr ? corr[n] : 0.0)) * (cs ? cs[n] : 1.0) * rs[m];
      err = std::max(err, std::fabs(v - ref[size_t(m) * N + n]));
    }
  // bf16: identical operands, fp32 accumulation: only summation order differs. int8: two 8-bit
  // roundings (steps of max/127) measured <= 1.2% of the largest output.
  EXPECT_LE(err, (wt == WeightType::BF16 ? 1e-4 : 3e-2) * max_abs(ref));
  EXPECT_TRUE(std::isnan(y[N])) << "wrote beyond N columns";
}

// oneDNN multiplies on AMX tiles exactly where isa() has them (the OS granted the tile state and
// ALPAMAYO_CPU_ISA allows them) and never elsewhere; Matmul.MatchesReference checks the values on whichever
// unit it took. The seed's per-thread gate/up shape.
TEST(Matmul, OnednnUsesAmxExactlyWhereUsable) {
  const IsaInfo& info = isa();  // first: it caps oneDNN (ALPAMAYO_CPU_ISA) before any primitive exists
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  OnednnPrimitives kernels(eng);
  ScopedOmpThreads one(1);
  const std::tuple<WeightType, uint32_t, const char*> cases[] = {{WeightType::BF16, kAmxBf16, "amx_bf16"},
                                                                   {WeightType::INT8, kAmxInt8, "amx_int8"}};
  for (const auto& [wt, flag, name] : cases) {
    std::string impl;
    try {
      impl = kernels.get(wt, 64, 1536, 1024, 1024)->pd.impl_info_str();
    } catch (const alpamayo::Error& e) {  // e.g. no bf16 matmul in oneDNN under ALPAMAYO_CPU_ISA=avx2
      EXPECT_FALSE(info.has(flag)) << e.what();
      std::printf("  [skipped] %s on oneDNN: %s\n", name, e.what());
      continue;
    }
    if (info.has(flag)) {
      EXPECT_NE(impl.find("amx"), std::string::npos) << name << " is usable, oneDNN chose " << impl;
      std::printf("  %s usable here: oneDNN runs %s\n", name, impl.c_str());
    } else {
      EXPECT_EQ(impl.find("amx"), std::string::npos) << name << " is not usable, oneDNN chose " << impl;
      std::printf("  [skipped] %s on oneDNN: not usable here (isa: %s); oneDNN runs %s\n", name,
                  info.describe().c_str(), impl.c_str());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Matmul,
                         ::testing::Combine(::testing::Values(WeightType::BF16, WeightType::INT8), ::testing::Values(5, 64),
                                            ::testing::Values(64, 200), ::testing::Values(64, 96)));

// The int8 cache's vectorised quantisation gives quantize_row_s8's bits (kv_int8.h), bf16 and fp32 rows, with the
// key bias, on rows of any length, with ties, zeros and non-finite values.
TEST(CpuOps, Int8CacheRowsMatchTheDefinition) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d : {1, 2, 7, 8, 34, 128, 130}) {
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> x(d);
      for (float& v : x) v = bf16_round(nd(rng) * 3.f);
      if (kind == 1) std::fill(x.begin(), x.end(), 0.f);
      if (kind == 2) {  // ties: a = 127 / 2^k makes x * (127 / a) land on halves
        for (int c = 0; c < d; ++c) x[c] = float(c % 255 - 127) * 0.5f;
        x[0] = 127.f;
      }
      if (kind == 3) x[d / 2] = NAN;
      if (kind == 4) x[d - 1] = -INFINITY;
      std::vector<uint16_t> xb(d);
      for (int c = 0; c < d; ++c) xb[c] = f32_to_bf16(x[c]);
      std::vector<int8_t> want(d), got(d), got_b(d);
      const float s = quantize_row_s8(x.data(), d, want.data());
      for (int bias : {0, 128}) {
        const float sf = quantize_row_avx2(x.data(), false, d, bias, got.data());
        const float sb = quantize_row_avx2(xb.data(), true, d, bias, got_b.data());
        for (float sx : {sf, sb}) {
          if (std::isnan(s)) EXPECT_TRUE(std::isnan(sx)) << "d " << d << " kind " << kind;
          else EXPECT_EQ(sx, s) << "d " << d << " kind " << kind;
        }
        for (int c = 0; c < d; ++c) {
          const int8_t w = static_cast<int8_t>(static_cast<uint8_t>(int(want[c]) + bias));
          ASSERT_EQ(got[c], w) << "fp32 d " << d << " kind " << kind << " c " << c << " bias " << bias;
          ASSERT_EQ(got_b[c], w) << "bf16 d " << d << " kind " << kind << " c " << c << " bias " << bias;
        }
      }
    }
  }
}

TEST(CpuOps, RmsNormRowsBf16AndInt8) {
  std::mt19937 rng(5);
  const int rows = 5, n = 96;
  const auto x = rand_bf16(size_t(rows) * n, 2.f, rng), w = rand_bf16(n, 1.f, rng);
  std::vector<float> ref(x.size()), tmp(n), scale(rows);
  ref::rms_norm(x.data(), w.data(), rows, n, 1e-6, ref.data());
  std::vector<uint16_t> ob(x.size());
  std::vector<uint8_t> oq(x.size());
  rms_norm_rows(x.data(), w.data(), 0, rows, n, 1e-6f, tmp.data(), ob.data(), nullptr, nullptr);
  rms_norm_rows(x.data(), w.data(), 0, rows, n, 1e-6f, tmp.data(), nullptr, oq.data(), scale.data());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) {
      const float v = ref[size_t(r) * n + i];
      EXPECT_NEAR(bf16_to_f32(ob[size_t(r) * n + i]), v, std::fabs(v) * 0x1p-8 + 1e-6);
      EXPECT_NEAR((oq[size_t(r) * n + i] - 128) * scale[r], v, 0.5f * scale[r] + 1e-6);
    }
}

TEST(CpuOps, HeadNormRope) {
  std::mt19937 rng(9);
  const int d = 64;
  auto x = rand_bf16(d, 1.f, rng);
  const auto w = rand_bf16(d, 1.f, rng), cs = rand_bf16(d, 1.f, rng), sn = rand_bf16(d, 1.f, rng);
  std::vector<float> ref(d), tmp(d);
  ref::rms_norm(x.data(), w.data(), 1, d, 1e-6, ref.data());
  ref::rope_apply(ref.data(), 1, 1, d, cs.data(), sn.data());
  head_norm_rope(x.data(), d, w.data(), 1e-6f, cs.data(), sn.data(), tmp.data());
  EXPECT_LE(max_diff(x.data(), ref.data(), d), 1e-5 * max_abs(ref));
}

TEST(CpuOps, SiluMulAndResidual) {
  const int M = 3, n = 10;
  std::vector<float> y(size_t(M) * 2 * n), out(size_t(M) * n), rs = {1.f, 0.5f, 2.f};
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::sin(float(i));
  std::vector<float> corr(2 * n), cs(2 * n);
  for (int c = 0; c < 2 * n; ++c) corr[c] = 0.01f * c, cs[c] = 1.f + 0.1f * c;
  silu_mul_rows(y.data(), M, n, rs.data(), corr.data(), cs.data(), n, nullptr, out.data());
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < n; ++c) {
      const float g = (y[size_t(r) * 2 * n + c] - corr[c]) * cs[c] * rs[r],
                  u = (y[size_t(r) * 2 * n + n + c] - corr[n + c]) * cs[n + c] * rs[r];
      EXPECT_NEAR(out[size_t(r) * n + c], ref::silu(g) * u, 1e-6);
    }
  std::vector<float> h(size_t(M) * 12, 1.f);
  add_rows(h.data(), 12, out.data(), n, M, n, rs.data(), nullptr, nullptr);
  EXPECT_FLOAT_EQ(h[12 + 3], 1.f + out[n + 3] * 0.5f);
  EXPECT_FLOAT_EQ(h[12 + 11], 1.f);  // beyond n untouched
}

TEST(CpuOps, ThreadPoolBarrierAndErrors) {
  ThreadPool pool(3);
  std::atomic<int> phase1{0};
  std::vector<int> seen(3, -1);
  pool.run([&](int t) {
    phase1.fetch_add(1);
    pool.barrier();
    seen[t] = phase1.load();
    pool.barrier();
  });
  EXPECT_EQ(seen, std::vector<int>(3, 3));
  EXPECT_THROW(pool.run([&](int t) {
                 if (t == 2) throw std::runtime_error("x");
               }),
               std::runtime_error);
  int ran = 0;
  pool.run([&](int t) { if (t == 0) ++ran; });
  EXPECT_EQ(ran, 1);
}

// The matmuls' work stealing: owners take from the front, the others from the back, every item exactly once.
TEST(CpuOps, StealQueueHandsOutEveryItemOnce) {
  StealQueue q;
  q.reset(3, 7);
  EXPECT_EQ(q.take_front(), 3);
  EXPECT_EQ(q.take_back(), 6);
  EXPECT_EQ(q.take_front(), 4);
  EXPECT_EQ(q.take_back(), 5);
  EXPECT_EQ(q.take_front(), -1);
  EXPECT_EQ(q.take_back(), -1);
  q.reset(2, 2);
  EXPECT_EQ(q.take_back(), -1);

  // Four threads, each owning a queue, then taking from the others' backs: each item claimed once.
  constexpr int kThreads = 4, kItems = 5000;
  ThreadPool pool(kThreads);
  std::vector<StealQueue> queues(kThreads);
  for (int round = 0; round < 20; ++round) {
    // Uneven queues, one empty, so that stealing happens.
    const int bounds[kThreads + 1] = {0, kItems / 10, kItems / 10, kItems / 2, kItems};
    for (int t = 0; t < kThreads; ++t) queues[t].reset(bounds[t], bounds[t + 1]);
    std::vector<std::atomic<int>> claimed(kItems);
    pool.run([&](int t) {
      for (int i; (i = queues[t].take_front()) >= 0;) claimed[i].fetch_add(1);
      for (int v = 1; v < kThreads; ++v)
        for (int i; (i = queues[(t + v) % kThreads].take_back()) >= 0;) claimed[i].fetch_add(1);
    });
    for (int i = 0; i < kItems; ++i) ASSERT_EQ(claimed[i].load(), 1) << "item " << i << ", round " << round;
  }
}

}  // namespace
}  // namespace alpamayo::cpu
