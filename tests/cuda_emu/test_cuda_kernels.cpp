// The cuda backend's kernels, run from their own source on the host by the SIMT emulator (simt_emu.h, through
// this folder's include/backends/cuda/device_api.h). Each op against the reference op is the op suite's instance
// `CudaEmu/Ops.*` (tests/cpp/ops/cuda_emu_kernels.h, instantiated at the end of this file, where the kernels are
// defined); here: the q/k/v heads' attention layouts, the fp8 weights' quantisation and the cache scan /
// conversion. These run on every machine (no GPU needed); they check indexing, fragment layouts, masking and
// pipelines. The GPU itself is checked by the conformance suite.
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
#include "model/fourier.h"

namespace alpamayo::ALP_CUDA_NS {
namespace {

std::mt19937 rng(7);

std::vector<float> randn(size_t n, float sd = 1.f, float mean = 0.f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
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

TEST(CudaKernels, QkNormRopeWritesHeadsInAttentionLayouts) {
  const int B = 2, T = 3, Hq = 4, Hkv = 2, d = 48, M = B * T, heads = Hq + 2 * Hkv;
  SplitOut qkv(M, heads * d, true);
  const std::vector<float> qn = randn(d, 0.1f, 1.f), kn = randn(d, 0.1f, 1.f);
  const std::vector<float> cs = randn(size_t(M) * d), sn = randn(size_t(M) * d);
  std::vector<uint16_t> q(size_t(M) * Hq * d), k(size_t(M) * Hkv * d), v(size_t(M) * Hkv * d);
  const int blocks = (M * heads + kern::kHeadWarps - 1) / kern::kHeadWarps;
  simt::launch(kern::qk_norm_rope_k, dim3(blocks), dim3(kern::kHeadWarps * 32), kern::kHeadWarps * d * sizeof(float),
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

// The fp8 weights: per-output-channel scales; the largest |w| of each row maps to 448 exactly.
TEST(CudaKernels, Fp8WeightRowsMapTheirLargestTo448) {
  const int N = 4, K = 40;
  const std::vector<float> w = randn(size_t(N) * K);
  std::vector<uint8_t> q(w.size());
  std::vector<float> scale(N);
  simt::launch(kern::quantize_rows_k, dim3(N), dim3(kern::kRowThreads), 0, w.data(), K, q.data(), scale.data());
  for (int n = 0; n < N; ++n) {
    float amax = 0;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[size_t(n) * K + k]));
    EXPECT_FLOAT_EQ(scale[n], amax / 448.f);
    for (int k = 0; k < K; ++k)
      EXPECT_EQ(q[size_t(n) * K + k],
                uint8_t(__nv_cvt_float_to_fp8(w[size_t(n) * K + k] / scale[n], __NV_SATFINITE, __NV_E4M3)));
  }
}

TEST(CudaKernels, CacheScanFindsTheFirstNonFiniteValidValue) {
  const int B = 2, H = 3, P = 10, d = 8;
  const std::vector<int> lo = {0, 1}, S = {10, 4};  // rows read: [lo, S) (sample 1 has one row of left padding)
  for (CacheType t : {CacheType::F32, CacheType::F16, CacheType::BF16}) {
    std::vector<float> v = randn(size_t(B) * H * P * d);
    auto at = [&](int b, int h, int p, int i) -> float& { return v[((size_t(b) * H + h) * P + p) * d + i]; };
    at(1, 0, 5, 2) = NAN;        // padding of sample 1: ignored
    at(1, 1, 0, 3) = NAN;        // its left padding: ignored
    at(1, 2, 3, 7) = INFINITY;   // valid: found
    at(1, 2, 2, 0) = -INFINITY;  // valid and earlier: this one
    std::vector<uint8_t> bytes(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == CacheType::F32) std::memcpy(&bytes[4 * i], &v[i], 4);
      const uint16_t h16 = t == CacheType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      if (t != CacheType::F32) std::memcpy(&bytes[2 * i], &h16, 2);
    }
    const KVView view{bytes.data(), int64_t(H) * P * d, int64_t(P) * d, d};  // dense [B, H, P, d]
    unsigned long long first = ~0ull;
    simt::launch(kern::scan_k, dim3(2, B * H), dim3(256), 0, view, t, H, P, d, lo.data(), S.data(), &first);
    EXPECT_EQ(first, ((size_t(1) * H + 2) * P + 2) * d + 0);
    std::vector<uint16_t> conv(v.size(), 0);
    at(1, 2, 3, 7) = at(1, 2, 2, 0) = 0.f;
    simt::launch(kern::convert_k, dim3(2, B * H), dim3(256), 0, view, t, H, P, d, lo.data(), S.data(), conv.data());
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < H; ++hh)
        for (int p = 0; p < P; ++p)
          for (int i = 0; i < d; ++i) {
            const size_t idx = ((size_t(b) * H + hh) * P + p) * d + i;
            if (p < lo[b] || p >= S[b]) {
              EXPECT_EQ(conv[idx], 0) << "a row not read was converted";
              continue;
            }
            if (!std::isfinite(bf16_to_f32(conv[idx]))) continue;
            const float src = t == CacheType::F32   ? v[idx]
                              : t == CacheType::F16 ? f16_to_f32(f32_to_f16(v[idx]))
                                                    : bf16_round(v[idx]);
            EXPECT_EQ(conv[idx], f32_to_bf16(src));
          }
  }
}

// The same kernels over a paged pool (token-major pages [pages, S, H, d], a page table per sequence): they read
// each row where the table puts it, report the first non-finite value by its logical [n, h, row, col] index and
// write the dense [B, H, P, d] rows. The pool's unused page and the rows past each sequence's end are NaN.
TEST(CudaKernels, CacheScanAndConversionReadThroughThePageTable) {
  const int B = 2, H = 2, P = 8, d = 8, S = 4, width = P / S, pool_pages = 5;
  const std::vector<int> lo = {1, 0}, hi = {8, 6};
  const std::vector<int64_t> table = {3, 0, 4, 1};  // page 2 is unused
  const std::vector<float> v = randn(size_t(B) * H * P * d);  // logical values
  std::vector<uint16_t> pool(size_t(pool_pages) * S * H * d, f32_to_bf16(NAN));
  auto pool_at = [&](int n, int h, int i, int c) -> uint16_t& {
    return pool[((size_t(table[n * width + i / S]) * S + i % S) * H + h) * d + c];
  };
  for (int n = 0; n < B; ++n)
    for (int h = 0; h < H; ++h)
      for (int i = lo[n]; i < hi[n]; ++i)
        for (int c = 0; c < d; ++c) pool_at(n, h, i, c) = f32_to_bf16(v[((size_t(n) * H + h) * P + i) * d + c]);
  const KVView view{pool.data(), int64_t(S) * H * d, d, int64_t(H) * d, table.data(), width, 2};
  unsigned long long first = ~0ull;
  simt::launch(kern::scan_k, dim3(2, B * H), dim3(256), 0, view, CacheType::BF16, H, P, d, lo.data(), hi.data(),
               &first);
  EXPECT_EQ(first, ~0ull) << "only unread rows hold NaN";
  std::vector<uint16_t> conv(v.size(), 0);
  simt::launch(kern::convert_k, dim3(2, B * H), dim3(256), 0, view, CacheType::BF16, H, P, d, lo.data(), hi.data(),
               conv.data());
  for (int n = 0; n < B; ++n)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < P; ++i)
        for (int c = 0; c < d; ++c) {
          const size_t idx = ((size_t(n) * H + h) * P + i) * d + c;
          EXPECT_EQ(conv[idx], i >= lo[n] && i < hi[n] ? f32_to_bf16(v[idx]) : 0) << n << " " << h << " " << i;
        }
  pool_at(1, 1, 5, 3) = f32_to_bf16(INFINITY);  // sequence 1's page 1 (pool page 1), row 1
  pool_at(1, 0, 6, 0) = f32_to_bf16(NAN);       // past its valid rows: ignored
  simt::launch(kern::scan_k, dim3(2, B * H), dim3(256), 0, view, CacheType::BF16, H, P, d, lo.data(), hi.data(),
               &first);
  EXPECT_EQ(first, ((size_t(1) * H + 1) * P + 5) * d + 3);
}

}  // namespace
}  // namespace alpamayo::ALP_CUDA_NS

#include "ops/cuda_emu_kernels.h"

namespace alpamayo::opsuite {
namespace {

INSTANTIATE_TEST_SUITE_P(CudaEmu, Ops, ::testing::ValuesIn(cases(cuda_emu_kernels::backend_ops())), case_name);

TEST(OpSuite, CudaCoversTheContract) { expect_covers_the_contract(cuda_emu_kernels::backend_ops()); }

}  // namespace
}  // namespace alpamayo::opsuite
