// The cpu backend's block-format weights (bfp_matmul.h): stored bytes and values against alpamayo::bfp and the
// reference backend's quantisation (weight_formats.h), and both matmul kernels against exact products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "alpamayo/bfp.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/runtime/aligned.h"
#include "backends/cpu/matmul/bfp_matmul.h"
#include "backends/weight_formats.h"

namespace alpamayo::cpu {
namespace {

// Heavy-tailed weights with a few outliers and a band of tiny blocks (shared exponents below 7, where the
// bfp8_b block scale is a denormal), so every decoding path is exercised.
std::vector<float> weights(int N, int K, uint64_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(N) * K);
  for (size_t i = 0; i < w.size(); ++i) {
    const float z = nd(rng);
    w[i] = 0.05f * z * std::exp(0.5f * nd(rng));
    if (i % 997 == 3) w[i] *= 40.f;
  }
  for (int n = 0; n < std::min(N, 16); ++n)
    for (int k = 0; k < std::min(K, 5); ++k) w[size_t(n) * K + k] = std::ldexp(1.f + 0.37f * nd(rng), -123 + (n % 4));
  return w;
}

BlockStore store_of(bfp::Format f) { return f == bfp::Format::Bfp8_b ? BlockStore::BFP8_B : BlockStore::BFP4_B; }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(BlockWeights, TransposedQuantisationIsBfpOfTheTransposedMatrix) {
  for (bfp::Format f : {bfp::Format::Bfp8_b, bfp::Format::Bfp4_b}) {
    const int N = 200, K = 77;
    std::vector<float> w = weights(N, K, 1), wt(size_t(K) * N);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) wt[size_t(k) * N + n] = w[size_t(n) * K + k];
    quantize_linear_transposed(f, w.data(), N, K);
    bfp::quantize_matrix(f, wt.data(), K, N);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        ASSERT_EQ(bits(w[size_t(n) * K + k]), bits(wt[size_t(k) * N + n])) << bfp::format_name(f) << " " << n << "," << k;
  }
}

// The thread slices of a matrix hold exactly the values the reference backend multiplies with, and their bytes
// are ttnn's tiles of W^T.
TEST(BlockWeights, SlicesHoldTheReferenceBitsAndTtnnTiles) {
  const int N = 200, K = 77;
  const std::vector<float> w = weights(N, K, 2);
  const int cuts[] = {0, 64, 192, 200};
  for (int s = 0; s < 3; ++s) {
    const BlockStore st = static_cast<BlockStore>(s);
    std::vector<float> full = w;
    WeightFormat wf;
    wf.block = bfp::Format::Bfp8_b;
    if (st == BlockStore::BF16) wf.bf16[static_cast<int>(LinearKind::Down)] = true;
    if (st == BlockStore::BFP4_B) wf.block = bfp::Format::Bfp4_b;
    apply_weight_format(wf, LinearKind::Down, full.data(), N, K);
    for (int i = 0; i < 3; ++i) {
      BlockWeights bw;
      bw.pack(st, w.data() + size_t(cuts[i]) * K, K, cuts[i + 1] - cuts[i]);
      const std::vector<float> got = bw.dequantize();
      for (int n = cuts[i]; n < cuts[i + 1]; ++n)
        for (int k = 0; k < K; ++k)
          ASSERT_EQ(bits(got[size_t(n - cuts[i]) * K + k]), bits(full[size_t(n) * K + k]))
              << "store " << s << " slice " << i << " at " << n << "," << k;
    }
  }
  // Tile bytes: the first panel (two tile columns) of a slice at column 64 vs pack_matrix of the whole W^T.
  std::vector<float> wt(size_t(K) * N);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) wt[size_t(k) * N + n] = w[size_t(n) * K + k];
  for (bfp::Format f : {bfp::Format::Bfp8_b, bfp::Format::Bfp4_b}) {
    const bfp::PackedMatrix pm = bfp::pack_matrix(f, wt.data(), K, N);
    BlockWeights bw;
    bw.pack(store_of(f), w.data() + size_t(64) * K, K, 128);
    const size_t tb = bfp::tile_bytes(f);
    for (int tr = 0; tr < bw.tile_rows(); ++tr)
      for (int j = 0; j < 2; ++j)
        ASSERT_EQ(0, std::memcmp(bw.data() + (size_t(tr) * 2 + j) * tb, pm.tile(tr, 2 + j), tb))
            << bfp::format_name(f) << " tile " << tr << "," << j;
  }
}

struct MmCase {
  int M, K, N;
};

class BlockMatmul : public ::testing::TestWithParam<std::tuple<int, MmCase, bool>> {};

std::vector<uint16_t> rand_x(int M, int ldx, uint64_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(size_t(M) * ldx);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  return x;
}

// y = x W^T against exact (double) sums of the same bf16 activations and dequantised weights: the kernels
// differ from them only by fp32 accumulation.
TEST_P(BlockMatmul, MatchesExactProducts) {
  const auto [s, c, avx] = GetParam();
  if (avx && !block_kernel_avx512_available()) GTEST_SKIP() << "no AVX512-BF16";
  const BlockStore st = static_cast<BlockStore>(s);
  const int ldx = c.K + 3, ldy = c.N + 5;
  const std::vector<float> w = weights(c.N, c.K, 3 + s);
  BlockWeights bw;
  bw.pack(st, w.data(), c.K, c.N);
  const std::vector<float> wq = bw.dequantize();
  const std::vector<uint16_t> x = rand_x(c.M, ldx, 5);
  std::vector<float> y(size_t(c.M) * ldy, -7.f);
  AlignedBuf<uint8_t> scratch(block_scratch_bytes());
  block_matmul(avx ? BlockKernel::Avx512Bf16 : BlockKernel::Portable, bw, x.data(), c.M, ldx, y.data(), ldy,
               scratch.data());
  for (int m = 0; m < c.M; ++m)
    for (int n = 0; n < ldy; ++n) {
      if (n >= c.N) {
        ASSERT_EQ(y[size_t(m) * ldy + n], -7.f) << "wrote past the columns at " << m << "," << n;
        continue;
      }
      double exact = 0, mag = 0;
      for (int k = 0; k < c.K; ++k) {
        const double p = double(bf16_to_f32(x[size_t(m) * ldx + k])) * wq[size_t(n) * c.K + k];
        exact += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(y[size_t(m) * ldy + n], exact, 2.0 * c.K * 0x1p-24 * mag + 1e-30) << m << "," << n;
    }
}

// With x = I the output is the dequantised weight itself (every sum has one non-zero term), so the kernel's
// decoding is checked bit for bit against alpamayo::bfp's.
TEST_P(BlockMatmul, DecodesExactly) {
  const auto [s, c, avx] = GetParam();
  if (avx && !block_kernel_avx512_available()) GTEST_SKIP() << "no AVX512-BF16";
  const BlockStore st = static_cast<BlockStore>(s);
  const int K = c.K;
  const std::vector<float> w = weights(c.N, K, 9 + s);
  BlockWeights bw;
  bw.pack(st, w.data(), K, c.N);
  const std::vector<float> wq = bw.dequantize();
  std::vector<uint16_t> x(size_t(K) * K, 0);
  for (int k = 0; k < K; ++k) x[size_t(k) * K + k] = f32_to_bf16(1.f);
  std::vector<float> y(size_t(K) * c.N);
  AlignedBuf<uint8_t> scratch(block_scratch_bytes());
  block_matmul(avx ? BlockKernel::Avx512Bf16 : BlockKernel::Portable, bw, x.data(), K, K, y.data(), c.N, scratch.data());
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < c.N; ++n)
      ASSERT_EQ(bits(y[size_t(k) * c.N + n]) & 0x7fffffffu, bits(wq[size_t(n) * K + k]) & 0x7fffffffu) << k << "," << n;
}

// M below, at and above the 6-row register tile; odd K, K across 256-row blocks; N with 16- and 32-column tails.
const std::vector<MmCase> kCases = {{1, 32, 16}, {5, 77, 100}, {7, 300, 64}, {13, 33, 200}, {64, 520, 96}};
std::string case_name(const ::testing::TestParamInfo<std::tuple<int, MmCase, bool>>& info) {
  const MmCase c = std::get<1>(info.param);
  static const char* st[] = {"bf16", "bfp8_b", "bfp4_b"};
  return std::string(st[std::get<0>(info.param)]) + "_M" + std::to_string(c.M) + "_K" + std::to_string(c.K) + "_N" +
         std::to_string(c.N) + (std::get<2>(info.param) ? "_avx512" : "_portable");
}
INSTANTIATE_TEST_SUITE_P(Shapes, BlockMatmul,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::ValuesIn(kCases), ::testing::Bool()),
                         case_name);

TEST(WeightFormat, Bf16ListIsCheckedAgainstTheFormat) {
  BackendOptions o;
  o.weights = "bfp4_b";
  o.bf16_weights = {"down", "qkv"};
  const WeightFormat wf = parse_weight_format(o);
  EXPECT_TRUE(wf.block_of(LinearKind::O).has_value());
  EXPECT_FALSE(wf.block_of(LinearKind::Down).has_value());
  EXPECT_FALSE(wf.block_of(LinearKind::QKV).has_value());
  o.bf16_weights = {"q"};
  EXPECT_THROW(parse_weight_format(o), std::exception);
  o.weights = "bf16";
  o.bf16_weights = {"down"};
  EXPECT_THROW(parse_weight_format(o), std::exception);
}

}  // namespace
}  // namespace alpamayo::cpu
