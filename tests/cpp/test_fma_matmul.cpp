// The bf16-weight matmul kernels on fp32 FMAs (src/backends/cpu/matmul/matmul_kernels.h): every kernel this machine runs
// against a double-precision reference on odd shapes, bitwise equality between column slicings and between the
// kernels (all compute the same fp32 FMA chain over k), packing layout and errors. int8 weights on the same
// kernels and on the int8 dot-product kernels avx512_vnni and avx2_int8 (exact int32 sums).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/runtime/aligned.h"
#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {


float bf(uint16_t h) { return bf16_to_f32(h); }

struct Case {
  int M, K, N;
  std::vector<uint16_t> x, W;  // x [M, K], W [N, K], bf16
};

Case make_case(int M, int K, int N, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Case c{M, K, N, std::vector<uint16_t>(size_t(M) * K), std::vector<uint16_t>(size_t(N) * K)};
  for (auto& v : c.x) v = f32_to_bf16(nd(rng));
  for (auto& v : c.W) v = f32_to_bf16(0.05f * nd(rng));
  return c;
}

// The int8 kernels that sum in int32 exactly (the rest compute the fp32 FMA chain).
bool exact_int8(MatmulKernel k) {
  return k == MatmulKernel::Avx512Vnni || k == MatmulKernel::Avx2Int8 || k == MatmulKernel::AmxInt8;
}

// y[M, ldy] for columns [0, N) with kernel k; the rest of y keeps its NaN fill (written-columns check).
std::vector<float> run(MatmulKernel k, const Case& c, int ldy) {
  MatmulWeights w;
  w.pack_bf16(k, c.W.data(), c.K, c.N);
  AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, c.M, c.K));
  std::vector<float> y(size_t(c.M) * ldy, std::nanf(""));
  run_matmul(w, c.x.data(), c.M, c.K, y.data(), ldy, scratch.data());
  return y;
}

// y [c.M, ldy] (kernel `what`) against a double-precision reference of x W^T: within fp32 sequential
// accumulation's |error| <= K * 2^-24 * sum |products| (loose, 2x), columns past N untouched (NaN). Raises
// *worst to the largest |y - ref| / sum |x w|. Fatal failures: call through ASSERT_NO_FATAL_FAILURE.
void expect_near_double_reference(const Case& c, const std::vector<float>& y, int ldy, const char* what,
                                  double* worst) {
  const int M = c.M, K = c.K, N = c.N;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < ldy; ++n) {
      const float got = y[size_t(m) * ldy + n];
      if (n >= N) {
        ASSERT_TRUE(std::isnan(got)) << what << ": column " << n << " past N written, M=" << M << " K=" << K;
        continue;
      }
      double ref = 0, mag = 0;
      for (int kk = 0; kk < K; ++kk) {
        const double p = double(bf(c.x[size_t(m) * K + kk])) * bf(c.W[size_t(n) * K + kk]);
        ref += p;
        mag += std::fabs(p);
      }
      const double bound = 2.0 * K * std::ldexp(1.0, -24) * mag + 1e-30;
      ASSERT_LE(std::fabs(got - ref), bound) << what << " M=" << M << " K=" << K << " N=" << N << " m=" << m
                                             << " n=" << n;
      if (mag > 0) *worst = std::max(*worst, std::fabs(got - ref) / mag);
    }
}

// The bf16 kernels that add the products in their own order (pairs of k, tiles of 32 k), not the fp32 FMA chain.
bool own_order(MatmulKernel k) { return k == MatmulKernel::Avx512Bf16 || k == MatmulKernel::AmxBf16; }

// The kernels this process runs, for bf16 weights or (int8) for int8 ones; chain: only those computing the fp32
// FMA chain (bitwise equal to portable_fma), i.e. not avx512_bf16 or amx_bf16.
std::vector<MatmulKernel> runnable(bool int8 = false, bool chain = false) {
  std::vector<MatmulKernel> r;
  for (MatmulKernel k : kMatmulKernels) {
    if (int8 ? !matmul_kernel_takes_int8(k) : !matmul_kernel_takes_bf16(k)) continue;
    if (chain && own_order(k)) continue;
    if (matmul_kernel_runnable(k))
      r.push_back(k);
    else
      std::printf("  [skipped] %s: not supported by this CPU / ALPAMAYO_CPU_ISA\n", matmul_kernel_name(k));
  }
  return r;
}

TEST(FmaMatmul, EveryKernelMatchesADoubleReferenceOnOddShapes) {
  double worst = 0;
  for (MatmulKernel k : runnable())
    for (int M : {1, 3, 17, 64, 130})
      for (int K : {1, 7, 64, 1000, 2100})  // 2100: three spans of the packed layout
        for (int N : {1, 15, 16, 33, 300}) {
          if (k == MatmulKernel::Portable && M * K * N > 4000000) continue;  // slow; bitwise-checked below
          const Case c = make_case(M, K, N, uint32_t(M * 1000003 + K * 1009 + N));
          const int ldy = N + 5;
          const std::vector<float> y = run(k, c, ldy);
          ASSERT_NO_FATAL_FAILURE(expect_near_double_reference(c, y, ldy, matmul_kernel_name(k), &worst));
        }
  std::printf("  worst |y - ref| / sum|x w|: %.3g\n", worst);
}

TEST(FmaMatmul, ColumnSlicesAndKernelsAreBitwiseEqual) {
  const std::vector<MatmulKernel> ks = runnable();  // avx512_bf16, amx_bf16: slices against their own whole result
  for (int M : {1, 17, 64, 130})
    for (int K : {7, 200, 1000, 2100}) {
      const int N = 300;
      const Case c = make_case(M, K, N, uint32_t(7 * M + K));
      // The portable kernel is the oracle: the same fp32 FMA chain over k, in C++.
      const std::vector<float> chain_ref = run(MatmulKernel::Portable, c, N);
      for (MatmulKernel k : ks) {
        const bool chain = !own_order(k);
        const std::vector<float> ref = chain ? chain_ref : run(k, c, N);
        if (chain) {
          EXPECT_EQ(run(k, c, N), ref) << matmul_kernel_name(k) << " vs portable_fma, M=" << M << " K=" << K;
        }
        // Column ranges as the backend's thread slices (multiples of 64) and odd ones, each packed on its own.
        for (const std::vector<int>& cuts : {std::vector<int>{0, 64, 192, 300}, std::vector<int>{0, 1, 17, 150, 299, 300}}) {
          std::vector<float> y(size_t(M) * N, std::nanf(""));
          for (size_t s = 0; s + 1 < cuts.size(); ++s) {
            const int n0 = cuts[s], n1 = cuts[s + 1];
            MatmulWeights w;
            w.pack_bf16(k, c.W.data() + size_t(n0) * K, K, n1 - n0);
            AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, M, K));
            run_matmul(w, c.x.data(), M, K, y.data() + n0, N, scratch.data());
          }
          EXPECT_EQ(y, ref) << matmul_kernel_name(k) << " sliced, M=" << M << " K=" << K;
        }
      }
    }
}

// amx_bf16 blocks its loop by the number of rows (groups of panels and row blocks outer from 128 rows on, one
// panel and half panels outer below; the last chunk's whole row blocks stored straight into y): the sums stay
// the same chain of products, so rows computed in a many-row call equal the same rows computed alone (few rows)
// bit for bit, whatever the column slicing (a partial group, a partial last panel); K of one chunk, of several
// and with an fp32 tail; and the results stay within the double reference's bound.
TEST(FmaMatmul, AmxBf16BlockingByRowsKeepsEveryResultBitwise) {
  if (!matmul_kernel_runnable(MatmulKernel::AmxBf16)) GTEST_SKIP() << "amx_bf16 does not run here";
  const MatmulKernel k = MatmulKernel::AmxBf16;
  // From 128 rows a span whose x fits 1.25 MB runs as one chunk of k (here M = 128 and 200 at K = 2048, 384 at
  // 1536: 1024 and 768 pairs), a larger one in chunks through the partial sums (M = 384, K = 2048): both are below.
  EXPECT_EQ(amx_matmul_chunk_pairs(128, 2048), 1024);
  EXPECT_EQ(amx_matmul_chunk_pairs(384, 1536), 768);
  EXPECT_LT(amx_matmul_chunk_pairs(384, 2048), 1024);
  for (int M : {128, 200, 384})
    for (int K : {64, 2048, 1000, 1536}) {
      const int N = 600, ldy = N + 7;  // 9 full panels and one of 24 columns: groups of 4, 4 and 2
      const Case c = make_case(M, K, N, uint32_t(13 * M + K));
      const std::vector<float> y = run(k, c, ldy);
      double worst = 0;
      ASSERT_NO_FATAL_FAILURE(expect_near_double_reference(c, y, ldy, "amx_bf16", &worst));
      // Rows 40..103 (64 rows: one panel at a time, half panels outer) alone, and column slices of the whole.
      const int r0 = 40, rows = 64;
      MatmulWeights w;
      w.pack_bf16(k, c.W.data(), K, N);
      AlignedBuf<uint8_t> few(matmul_scratch_bytes(k, rows, K));
      std::vector<float> ys(size_t(rows) * N);
      run_matmul(w, c.x.data() + size_t(r0) * K, rows, K, ys.data(), N, few.data());
      for (int m = 0; m < rows; ++m)
        for (int n = 0; n < N; ++n)
          ASSERT_EQ(ys[size_t(m) * N + n], y[size_t(r0 + m) * ldy + n]) << "M=" << M << " K=" << K << " row " << r0 + m;
      std::vector<float> yc(size_t(M) * ldy, std::nanf(""));
      const int cuts[] = {0, 64, 320, 600};  // slices of 1, 4 and 4.4 panels
      for (int i = 0; i < 3; ++i) {
        MatmulWeights wc;
        wc.pack_bf16(k, c.W.data() + size_t(cuts[i]) * K, K, cuts[i + 1] - cuts[i]);
        AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, M, K));
        run_matmul(wc, c.x.data(), M, K, yc.data() + cuts[i], ldy, scratch.data());
      }
      for (size_t i = 0; i < y.size(); ++i)
        if (!(std::isnan(y[i]) && std::isnan(yc[i]))) {
          ASSERT_EQ(yc[i], y[i]) << "M=" << M << " K=" << K << " at " << i;
        }
      std::printf("  M=%d K=%d: worst |y - ref| / sum|x w| %.3g\n", M, K, worst);
    }
}

// A matrix cut into column chunks on kernel k (bf16 or int8 weights): the weights as floats, x as the kernel takes
// it, the packing of columns [n0, n1), and the whole matrix's result (the reference the chunks must equal bitwise).
struct ChunkCase {
  MatmulKernel k;
  bool int8;
  Case c;                 // x and W as bf16, and the sizes
  std::vector<float> Wf;  // W as floats (exact)
  std::vector<uint8_t> xq;
  const void* x() const { return int8 ? static_cast<const void*>(xq.data()) : c.x.data(); }
  void pack(MatmulWeights& w, int n0, int n1, MatmulArena* arena = nullptr) const {
    if (int8) w.pack_int8(k, Wf.data() + size_t(n0) * c.K, c.K, n1 - n0, arena);
    else w.pack(k, Wf.data() + size_t(n0) * c.K, c.K, n1 - n0, arena);
  }
  std::vector<float> whole() const {
    MatmulWeights w;
    pack(w, 0, c.N);
    AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, c.M, c.K));
    std::vector<float> ref(size_t(c.M) * c.N);
    run_matmul(w, x(), c.M, c.K, ref.data(), c.N, scratch.data());
    return ref;
  }
};
ChunkCase chunk_case(MatmulKernel k, bool int8, int M, int K, int N, uint32_t seed) {
  ChunkCase cc{k, int8, make_case(M, K, N, seed), std::vector<float>(size_t(N) * K), {}};
  for (size_t i = 0; i < cc.Wf.size(); ++i) cc.Wf[i] = bf(cc.c.W[i]);
  cc.xq.resize(size_t(M) * K);
  for (size_t i = 0; i < cc.xq.size(); ++i) cc.xq[i] = uint8_t((cc.c.x[i] * 2654435761u) >> 7);
  return cc;
}

// The cpu backend's chunked matmuls: a slice packed as chunks back to back in one arena, run one after another on
// one scratch, the later calls reusing the x the first prepared (x_ready), equal the whole matrix bit for bit,
// for bf16 and int8 weights on every kernel this machine runs; a full arena is refused.
TEST(FmaMatmul, ChunksInOneArenaWithThePreparedXAreBitwiseEqual) {
  for (const bool int8 : {false, true})
    for (MatmulKernel k : runnable(int8))
      for (int M : {1, 17, 64})
        for (int K : {7, 1000, 2100}) {
          const int N = 300;
          const ChunkCase cc = chunk_case(k, int8, M, K, N, uint32_t(11 * M + K));
          const void* x = cc.x();
          const auto pack = [&](MatmulWeights& w, int n0, int n1, MatmulArena* arena) { cc.pack(w, n0, n1, arena); };
          const std::vector<float> ref = cc.whole();

          const std::vector<int> cuts = {0, 16, 64, 65, 200, 300};
          size_t bytes = 0;
          for (size_t i = 0; i + 1 < cuts.size(); ++i)
            bytes += MatmulWeights::packed_bytes(k, int8, K, cuts[i + 1] - cuts[i]);
          MatmulArena arena(bytes);
          std::vector<MatmulWeights> chunks(cuts.size() - 1);
          for (size_t i = 0; i + 1 < cuts.size(); ++i) pack(chunks[i], cuts[i], cuts[i + 1], &arena);
          EXPECT_EQ(arena.used, bytes);
          for (size_t i = 0; i + 1 < chunks.size(); ++i)  // back to back, 64-byte aligned
            EXPECT_EQ(reinterpret_cast<const char*>(chunks[i + 1].data()) - reinterpret_cast<const char*>(chunks[i].data()),
                      std::ptrdiff_t(MatmulWeights::packed_bytes(k, int8, K, cuts[i + 1] - cuts[i])));
          // Reversed order, as a thread taking chunks from another's back; fresh scratch, so x_ready really reuses.
          AlignedBuf<uint8_t> own(matmul_scratch_bytes(k, M, K));
          std::vector<float> y(size_t(M) * N, std::nanf(""));
          std::vector<float> part(size_t(M) * N);
          for (size_t j = chunks.size(); j-- > 0;) {
            const int n0 = cuts[j], n = cuts[j + 1] - cuts[j];
            run_matmul(chunks[j], x, M, K, part.data(), n, own.data(), j + 1 < chunks.size());
            for (int m = 0; m < M; ++m)
              for (int i = 0; i < n; ++i) y[size_t(m) * N + n0 + i] = part[size_t(m) * n + i];
          }
          ASSERT_EQ(y, ref) << matmul_kernel_name(k) << (int8 ? " int8" : " bf16") << " M=" << M << " K=" << K;
          MatmulWeights extra;
          EXPECT_THROW(pack(extra, 0, 16, &arena), Error) << "the arena is full";
        }
}

// run_matmul_many (the cpu backend's runs of chunks at many rows): chunks of odd widths (a panel's part, one
// column past a panel) run several per call, in any grouping and order, each into its own strided output, equal
// the whole matrix bit for bit, on every kernel this machine runs, below and from amx_bf16's many-rows blocking.
TEST(FmaMatmul, RunsOfChunksAreBitwiseEqualToTheWholeMatrix) {
  for (const bool int8 : {false, true})
    for (MatmulKernel k : runnable(int8))
      for (int M : {64, 128, 200})
        for (int K : {1000, 2048}) {
          const int N = 600;
          const ChunkCase cc = chunk_case(k, int8, M, K, N, uint32_t(7 * M + K));
          const void* x = cc.x();
          const std::vector<float> ref = cc.whole();

          const std::vector<int> cuts = {0, 16, 64, 128, 193, 320, 448, 600};
          std::vector<MatmulWeights> chunks(cuts.size() - 1);
          for (size_t i = 0; i + 1 < cuts.size(); ++i) cc.pack(chunks[i], cuts[i], cuts[i + 1]);
          // Runs: all at once, then pairs taken from the back (as a thief), each call on a fresh x or the last.
          for (const int per_run : {int(chunks.size()), 2}) {
            std::vector<float> y(size_t(M) * N, std::nanf(""));
            AlignedBuf<uint8_t> own(matmul_scratch_bytes(k, M, K));
            bool x_ready = false;
            for (int j1 = int(chunks.size()); j1 > 0; j1 -= per_run, x_ready = true) {
              std::vector<MatmulOut> outs;
              for (int j = std::max(0, j1 - per_run); j < j1; ++j)
                outs.push_back({&chunks[j], y.data() + cuts[j], N});
              run_matmul_many(outs.data(), int(outs.size()), x, M, K, own.data(), x_ready);
            }
            ASSERT_EQ(y, ref) << matmul_kernel_name(k) << (int8 ? " int8" : " bf16") << " M=" << M << " K=" << K
                              << " chunks per run " << per_run;
          }
        }
  EXPECT_EQ(matmul_many_columns(MatmulKernel::AmxBf16, kAmxManyRows - 1), 0);
  EXPECT_GT(matmul_many_columns(MatmulKernel::AmxBf16, kAmxManyRows), 0);
  EXPECT_EQ(matmul_many_columns(MatmulKernel::Avx512Bf16, 384), 0);
}

TEST(FmaMatmul, StridedActivationsAndRowSubsets) {
  // x with a row stride larger than K (a view into a wider buffer): the same result as dense rows.
  for (MatmulKernel k : runnable()) {
    const Case c = make_case(9, 70, 40, 5);
    const int ldx = 101;
    std::vector<uint16_t> xs(size_t(c.M) * ldx, 0x7fc0);  // NaN outside the rows' first K
    for (int m = 0; m < c.M; ++m) std::copy(c.x.begin() + size_t(m) * c.K, c.x.begin() + size_t(m + 1) * c.K, xs.begin() + size_t(m) * ldx);
    MatmulWeights w;
    w.pack_bf16(k, c.W.data(), c.K, c.N);
    AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, c.M, c.K));
    std::vector<float> y(size_t(c.M) * c.N);
    run_matmul(w, xs.data(), c.M, ldx, y.data(), c.N, scratch.data());
    EXPECT_EQ(y, run(own_order(k) ? k : MatmulKernel::Portable, c, c.N)) << matmul_kernel_name(k);
  }
}

TEST(FmaMatmul, PackingLayoutAndRounding) {
  // W [N, K] fp32 -> panels [K][width] of bf16 (RNE), zero-padded past N (K within one span).
  const int K = 3, N = 20;
  std::vector<float> W(size_t(N) * K);
  for (size_t i = 0; i < W.size(); ++i) W[i] = 1.f + float(i) / 256.f + 1.f / 1024.f;
  for (MatmulKernel k : kMatmulKernels) {
    MatmulWeights w;
    if (!matmul_kernel_takes_bf16(k)) {
      EXPECT_THROW(w.pack(k, W.data(), K, N), Error) << matmul_kernel_name(k);
      continue;
    }
    w.pack(k, W.data(), K, N);
    // avx512_bf16 keeps pairs of k side by side: [ceil(K/2)][pw][2], the odd K's last pair zero-padded.
    const int pw = matmul_panel_width(k), panels = (N + pw - 1) / pw, g = matmul_k_group(k);
    const int Kg = (K + g - 1) / g * g;
    ASSERT_EQ(w.bytes(), size_t(panels) * Kg * pw * 2) << matmul_kernel_name(k);
    for (int p = 0; p < panels; ++p)
      for (int kk = 0; kk < Kg; ++kk)
        for (int j = 0; j < pw; ++j) {
          const int n = p * pw + j;
          const uint16_t got =
              w.data()[size_t(p) * Kg * pw + (size_t(kk / g) * pw + matmul_packed_slot(k, false, j)) * g + kk % g];
          EXPECT_EQ(got, n < N && kk < K ? f32_to_bf16(W[size_t(n) * K + kk]) : uint16_t(0)) << matmul_kernel_name(k);
        }
  }
  // K over one span: spans of matmul_k_span(k) rows (kDotKSpan for the dot-product kernels), each holding every panel.
  for (MatmulKernel k : kMatmulKernels) {
    if (!matmul_kernel_takes_bf16(k)) continue;
    const int span = matmul_k_span(k), K2 = span + 5, N2 = 70;
    std::vector<float> W2(size_t(N2) * K2);
    for (size_t i = 0; i < W2.size(); ++i) W2[i] = float(i % 251) - 125.f;
    MatmulWeights w;
    w.pack(k, W2.data(), K2, N2);
    const int pw = matmul_panel_width(k), panels = (N2 + pw - 1) / pw, g = matmul_k_group(k);
    for (int n = 0; n < N2; ++n)
      for (int kk = 0; kk < K2; ++kk) {
        const int k0 = kk / span * span, ks = std::min(span, K2 - k0), ksg = (ks + g - 1) / g * g;
        const int r = kk - k0;
        const size_t at = size_t(k0) * panels * pw + size_t(n / pw) * ksg * pw +
                          (size_t(r / g) * pw + matmul_packed_slot(k, false, n % pw)) * g + r % g;
        ASSERT_EQ(w.data()[at], f32_to_bf16(W2[size_t(n) * K2 + kk])) << matmul_kernel_name(k) << " n=" << n << " k=" << kk;
      }
  }
  EXPECT_EQ(matmul_k_span(MatmulKernel::Avx512Vnni), kDotKSpan);
  EXPECT_EQ(matmul_k_span(MatmulKernel::Avx512), kFmaKSpan);
  EXPECT_EQ(kDotKSpan % kFmaKSpan, 0);
  MatmulWeights bad;
  EXPECT_THROW(bad.pack(MatmulKernel::Portable, W.data(), 0, N), Error);
  // The slots are a permutation of each panel's columns: avx512_fma's bf16 rows pair column c with c + 16.
  for (MatmulKernel k : kMatmulKernels)
    for (bool int8 : {false, true}) {
      const int pw = matmul_panel_width(k);
      std::vector<int> seen(pw, 0);
      for (int j = 0; j < pw; ++j) {
        const int s = matmul_packed_slot(k, int8, j);
        ASSERT_TRUE(s >= 0 && s < pw) << matmul_kernel_name(k);
        ++seen[s];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), pw) << matmul_kernel_name(k);
    }
  EXPECT_EQ(matmul_packed_slot(MatmulKernel::Avx512, false, 16), 1);
  EXPECT_EQ(matmul_packed_slot(MatmulKernel::Avx512, false, 33), 34);
  EXPECT_EQ(matmul_packed_slot(MatmulKernel::Avx512, true, 16), 16);
}

// int8 weights: s8 values, x as u8 = q + 128; y = sum_k q w exactly up to fp32 rounding of the sums.
struct CaseS8 {
  int M, K, N;
  std::vector<uint8_t> x;
  std::vector<int8_t> W;
  std::vector<float> scales;
};

CaseS8 make_s8(int M, int K, int N, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> q(-127, 127);
  CaseS8 c{M, K, N, std::vector<uint8_t>(size_t(M) * K), std::vector<int8_t>(size_t(N) * K), std::vector<float>(N)};
  for (auto& v : c.x) v = static_cast<uint8_t>(q(rng) + 128);
  for (auto& v : c.W) v = static_cast<int8_t>(q(rng));
  for (int n = 0; n < N; ++n) c.scales[n] = 0.01f * float(n + 1);
  return c;
}

std::vector<float> run_s8(MatmulKernel k, const CaseS8& c, int n0, int n1, std::vector<float>& y, int ldy) {
  MatmulWeights w;
  w.pack_s8(k, c.W.data() + size_t(n0) * c.K, c.scales.data() + n0, c.K, n1 - n0);
  EXPECT_EQ(w.type(), MatmulType::INT8);
  AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, c.M, c.K));
  run_matmul(w, c.x.data(), c.M, c.K, y.data() + n0, ldy, scratch.data());
  return std::vector<float>(w.col_correction(), w.col_correction() + (n1 - n0));
}

TEST(FmaMatmul, Int8KernelsMatchAnExactIntegerSumAndEachOther) {
  // Every partial sum here stays far below 2^24, so the FMA chain is exact and equals avx512_vnni's int32 sum.
  const std::vector<MatmulKernel> ks = runnable(true);  // avx512_bf16 takes no int8 weights
  for (int M : {1, 3, 17, 64, 130})
    for (int K : {1, 7, 64, 1000, 2100})
      for (int N : {1, 15, 16, 33, 300}) {
        const CaseS8 c = make_s8(M, K, N, uint32_t(M * 31 + K * 7 + N));
        std::vector<float> ref(size_t(M) * N, std::nanf(""));
        if (int64_t(M) * K * N <= 4000000) {
          run_s8(MatmulKernel::Portable, c, 0, N, ref, N);
        } else {
          run_s8(ks.front(), c, 0, N, ref, N);  // checked against the exact sums below, bitwise against the rest
        }
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            int64_t exact = 0, mag = 0;
            for (int kk = 0; kk < K; ++kk) {
              const int64_t p = int64_t(int(c.x[size_t(m) * K + kk]) - 128) * c.W[size_t(n) * K + kk];
              exact += p;
              mag += p < 0 ? -p : p;
            }
            ASSERT_LE(std::fabs(double(ref[size_t(m) * N + n]) - double(exact)), K * std::ldexp(double(mag), -24))
                << "M=" << M << " K=" << K << " N=" << N;
          }
        for (MatmulKernel k : ks) {
          std::vector<float> y(size_t(M) * N, std::nanf(""));
          const std::vector<float> corr = run_s8(k, c, 0, N, y, N);
          EXPECT_EQ(y, ref) << matmul_kernel_name(k) << " M=" << M << " K=" << K << " N=" << N;
          EXPECT_EQ(corr, std::vector<float>(N, 0.f));
          if (N == 300) {
            std::vector<float> ys(size_t(M) * N, std::nanf(""));
            for (auto [n0, n1] : {std::pair{0, 64}, std::pair{64, 77}, std::pair{77, 300}}) run_s8(k, c, n0, n1, ys, N);
            EXPECT_EQ(ys, ref) << matmul_kernel_name(k) << " sliced, M=" << M << " K=" << K;
          }
        }
      }
}

// K past one span of every dot-product kernel's layout (kDotKSpan; avx2_int8's spans are kFmaKSpan), so their span
// loops run more than once with a short last span: bf16 against a double reference, int8 exactly (every partial
// sum here is below 2^24, so exact in fp32 too).
TEST(FmaMatmul, DotKernelsAcrossTwoSpans) {
  const int K = kDotKSpan + 300;
  for (int M : {1, 7})
    for (int N : {33, 70}) {
      for (MatmulKernel k : runnable(false)) {
        if (!own_order(k)) continue;
        const Case c = make_case(M, K, N, uint32_t(M * 13 + N));
        const std::vector<float> y = run(k, c, N);
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            double ref = 0, mag = 0;
            for (int kk = 0; kk < K; ++kk) {
              const double p = double(bf(c.x[size_t(m) * K + kk])) * bf(c.W[size_t(n) * K + kk]);
              ref += p;
              mag += std::fabs(p);
            }
            ASSERT_LE(std::fabs(y[size_t(m) * N + n] - ref), 2.0 * K * std::ldexp(1.0, -24) * mag) << "m=" << m << " n=" << n;
          }
      }
      for (MatmulKernel k : runnable(true)) {
        if (!exact_int8(k)) continue;
        const CaseS8 c = make_s8(M, K, N, uint32_t(M * 17 + N));
        std::vector<float> y(size_t(M) * N, std::nanf(""));
        run_s8(k, c, 0, N, y, N);
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            int64_t exact = 0;
            for (int kk = 0; kk < K; ++kk)
              exact += int64_t(int(c.x[size_t(m) * K + kk]) - 128) * c.W[size_t(n) * K + kk];
            ASSERT_EQ(double(y[size_t(m) * N + n]), double(exact)) << "m=" << m << " n=" << n;
          }
      }
    }
}

TEST(FmaMatmul, Int8PackingQuantizesLikeTheOnednnPath) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.05f);
  const int K = 300, N = 70;
  std::vector<float> W(size_t(N) * K);
  for (float& v : W) v = nd(rng);
  for (int kk = 0; kk < K; ++kk) W[size_t(5) * K + kk] = 0.f;  // an all-zero row: scale 1
  for (MatmulKernel k : kMatmulKernels) {
    MatmulWeights w;
    if (!matmul_kernel_takes_int8(k)) {
      EXPECT_THROW(w.pack_int8(k, W.data(), K, N), Error) << matmul_kernel_name(k);
      continue;
    }
    w.pack_int8(k, W.data(), K, N);
    const int pw = matmul_panel_width(k);
    const int g = matmul_k_group(k);  // [K/g][pw][g] (K = 300: one span)
    for (int n = 0; n < N; ++n) {
      float mx = 0.f;
      for (int kk = 0; kk < K; ++kk) mx = std::max(mx, std::fabs(W[size_t(n) * K + kk]));
      const float sc = mx > 0.f ? mx / 127.f : 1.f;
      ASSERT_EQ(w.col_scale()[n], sc);
      ASSERT_EQ(w.col_correction()[n], 0.f);
      int sum = 0;
      for (int kk = 0; kk < K; ++kk) {
        const int q = static_cast<int>(std::lrintf(std::clamp(W[size_t(n) * K + kk] / sc, -127.f, 127.f)));
        const size_t at = size_t(n / pw) * K * pw + (size_t(kk / g) * pw + n % pw) * g + kk % g;
        ASSERT_EQ(w.data_s8()[at], q) << matmul_kernel_name(k) << " " << n << " " << kk;
        sum += q;
      }
      if (k == MatmulKernel::Avx512Vnni || k == MatmulKernel::AmxInt8) {
        ASSERT_EQ(w.col_sums()[n], sum) << n;
      } else {
        ASSERT_EQ(w.col_sums(), nullptr);
      }
    }
  }
}

// The quantizer's rounding at exact ties (half to even, as lrintf in the default mode), and the int8 layouts
// across spans with a partial last k-group: every element where the layout puts it.
TEST(FmaMatmul, Int8PackingRoundsTiesToEvenAndPadsEverySpan) {
  for (MatmulKernel k : kMatmulKernels) {
    if (!matmul_kernel_takes_int8(k)) continue;
    const int span = matmul_k_span(k), K = span + 7, N = 67;
    std::vector<float> W(size_t(N) * K);
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> half_steps(-254, 254);
    for (float& v : W) v = 0.5f * float(half_steps(rng));  // row max 127 gives scale 1: every odd value a tie
    for (int n = 0; n < N; ++n) W[size_t(n) * K + (n * 7) % K] = n % 2 ? 127.f : -127.f;
    const float ties[] = {0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, 126.5f, -126.5f};
    for (int i = 0; i < 8; ++i) W[size_t(3) * K + 100 + i] = ties[i];
    MatmulWeights w;
    w.pack_int8(k, W.data(), K, N);
    const int pw = matmul_panel_width(k), panels = (N + pw - 1) / pw, g = matmul_k_group(k);
    for (int n = 0; n < N; ++n) {
      float mx = 0.f;
      for (int kk = 0; kk < K; ++kk) mx = std::max(mx, std::fabs(W[size_t(n) * K + kk]));
      const float sc = mx / 127.f;
      ASSERT_EQ(w.col_scale()[n], sc);
      for (int kk = 0; kk < K; ++kk) {
        const int q = static_cast<int>(std::lrintf(std::clamp(W[size_t(n) * K + kk] / sc, -127.f, 127.f)));
        const int k0 = kk / span * span, ks = std::min(span, K - k0), ksg = (ks + g - 1) / g * g;
        const int r = kk - k0;
        const size_t at = size_t(k0) * panels * pw + size_t(n / pw) * ksg * pw +
                          (size_t(r / g) * pw + matmul_packed_slot(k, true, n % pw)) * g + r % g;
        ASSERT_EQ(w.data_s8()[at], q) << matmul_kernel_name(k) << " n=" << n << " k=" << kk;
      }
    }
    // Row 3 (scale 1, panel 0, span 0): the ties at k = 100..107 go to the even neighbour.
    const int even[] = {0, 0, 2, -2, 2, -2, 126, -126};
    for (int i = 0; i < 8; ++i) {
      const int kk = 100 + i;
      EXPECT_EQ(w.data_s8()[(size_t(kk / g) * pw + matmul_packed_slot(k, true, 3)) * g + kk % g], even[i]) << kk;
    }
    // The padding: k past K in the last group, columns past N in the last panel.
    const int k0 = K / span * span, ksg = (K - k0 + g - 1) / g * g;
    for (int p = 0; p < panels; ++p)
      for (int r = 0; r < ksg; ++r)
        for (int j = 0; j < pw; ++j) {
          if (p * pw + j < N && k0 + r < K) continue;
          ASSERT_EQ(w.data_s8()[size_t(k0) * panels * pw + size_t(p) * ksg * pw +
                                (size_t(r / g) * pw + matmul_packed_slot(k, true, j)) * g + r % g], 0)
              << matmul_kernel_name(k);
        }
  }
}

// The int8 dot-product kernels (avx512_vnni, avx2_int8) sum in int32, exactly: where the fp32 FMA chain must round
// (partial sums past 2^24), their result is the exact sum rounded once. Also: the K padding of the last group
// (K % 4 != 0, odd K), several spans of the packed layout (avx2_int8's int32 partials go through y between them),
// strided activations, activations at both ends of u8 (q = -128 and 127) against weights at both ends of s8
// (-128 and 127), and the K bound past which int32 could overflow.
TEST(FmaMatmul, Int8DotKernelsSumExactlyWithPaddingAndStrides) {
  for (MatmulKernel k : {MatmulKernel::Avx512Vnni, MatmulKernel::Avx2Int8, MatmulKernel::AmxInt8}) {
    if (!matmul_kernel_runnable(k)) {
      std::printf("  [skipped] %s: not supported by this CPU / ALPAMAYO_CPU_ISA\n", matmul_kernel_name(k));
      continue;
    }
    for (int K : {2101, 2103, 4096}) {
      const int M = 7, N = 70, ldx = K + 9;
      std::vector<int8_t> W(size_t(N) * K);
      std::vector<uint8_t> x(size_t(M) * ldx, 0);  // q = -128 past each row's K: must not be read
      std::mt19937 rng(K);
      for (size_t i = 0; i < W.size(); ++i) W[i] = static_cast<int8_t>(i % 3 == 0 ? -128 : 127 - int(rng() % 3));
      for (int m = 0; m < M; ++m)
        for (int kk = 0; kk < K; ++kk)
          x[size_t(m) * ldx + kk] = static_cast<uint8_t>(m % 3 == 1 ? 255 : m % 3 == 2 ? 0 : 1 + rng() % 4);
      const std::vector<float> scales(N, 1.f);
      MatmulWeights w;
      w.pack_s8(k, W.data(), scales.data(), K, N);
      AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, M, K));
      std::vector<float> y(size_t(M) * N, std::nanf(""));
      run_matmul(w, x.data(), M, ldx, y.data(), N, scratch.data());
      int rounded = 0;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          int64_t exact = 0;
          for (int kk = 0; kk < K; ++kk) exact += int64_t(int(x[size_t(m) * ldx + kk]) - 128) * W[size_t(n) * K + kk];
          ASSERT_EQ(y[size_t(m) * N + n], float(exact)) << matmul_kernel_name(k) << " K=" << K << " m=" << m << " n=" << n;
          rounded += double(float(exact)) != double(exact);
        }
      if (K == 4096) {
        EXPECT_GT(rounded, 0) << "the case must reach sums an fp32 chain cannot hold";
      }
    }
  }
  const float scale = 1.f;
  for (auto [k, bound] : {std::pair{MatmulKernel::Avx512Vnni, kVnniMaxK}, std::pair{MatmulKernel::Avx2Int8, kAvx2Int8MaxK},
                          std::pair{MatmulKernel::AmxInt8, kVnniMaxK}}) {
    MatmulWeights big;
    const std::vector<int8_t> one(size_t(bound) + 1, 1);
    EXPECT_THROW(big.pack_s8(k, one.data(), &scale, bound + 1, 1), Error) << matmul_kernel_name(k);
    big.pack_s8(k, one.data(), &scale, bound, 1);
    EXPECT_EQ(big.K(), bound);
    if (!matmul_kernel_runnable(k)) continue;
    // At the bound, every product at its largest magnitude still sums exactly.
    AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, 1, bound));
    for (int8_t wv : {int8_t(-128), int8_t(127)})
      for (uint8_t xv : {uint8_t(0), uint8_t(255)}) {
        const std::vector<int8_t> wk(size_t(bound), wv);
        const std::vector<uint8_t> xk(size_t(bound), xv);
        big.pack_s8(k, wk.data(), &scale, bound, 1);
        float y = 0.f;
        run_matmul(big, xk.data(), 1, bound, &y, 1, scratch.data());
        EXPECT_EQ(y, float(int64_t(int(xv) - 128) * wv * bound)) << matmul_kernel_name(k) << " w=" << int(wv) << " x=" << int(xv);
      }
  }
}

// amx_int8 against avx512_vnni, bit for bit (both the exact int32 sum rounded once): M not a multiple of the tiles'
// 16 or 32 rows, K not a multiple of a tile's 64 k (the int32 tail after the tiles, a partial last quad), past one
// chunk and one span, N with odd tails; s8 and u8 over their whole ranges, strided x, y's columns past N untouched,
// odd column slices (each packed on its own), and x reused from the scratch (x_ready) by a second slice.
TEST(FmaMatmul, AmxInt8MatchesAvx512VnniBitwiseOnOddShapes) {
  for (MatmulKernel k : {MatmulKernel::AmxInt8, MatmulKernel::Avx512Vnni})
    if (!matmul_kernel_runnable(k)) {
      GTEST_SKIP() << matmul_kernel_name(k) << ": " << matmul_kernel_unavailable(k);
    }
  struct Shape {
    int M, K, N;
  };
  const Shape shapes[] = {{1, 1, 1},      {15, 63, 17},   {17, 65, 63},   {33, 130, 65},  {64, 1000, 131},
                          {70, 1536, 67}, {31, 2111, 129}, {5, 4099, 33}, {17, kDotKSpan + 100, 65},
                          // from kAmxManyRows: groups of panels (4, 4, 2; 3 and a part of one), rows outer
                          {kAmxManyRows, 1000, 600}, {200, 2111, 200},  {130, kDotKSpan + 100, 300}};
  for (const Shape& sh : shapes) {
    const int M = sh.M, K = sh.K, N = sh.N, ldx = K + 3, ldy = N + 5;
    std::mt19937 rng(uint32_t(M * 7919 + K * 31 + N));
    std::vector<int8_t> W(size_t(N) * K);
    std::vector<uint8_t> x(size_t(M) * ldx);
    for (auto& v : W) v = static_cast<int8_t>(int(rng() % 256) - 128);
    for (auto& v : x) v = static_cast<uint8_t>(rng() % 256);
    std::vector<float> scales(N, 1.f);
    auto run_k = [&](MatmulKernel k, int n0, int n1, std::vector<float>& y, void* scratch, bool x_ready) {
      MatmulWeights w;
      w.pack_s8(k, W.data() + size_t(n0) * K, scales.data() + n0, K, n1 - n0);
      run_matmul(w, x.data(), M, ldx, y.data() + n0, ldy, scratch, x_ready);
    };
    std::vector<float> ref(size_t(M) * ldy, std::nanf("")), got(ref);
    AlignedBuf<uint8_t> vs(matmul_scratch_bytes(MatmulKernel::Avx512Vnni, M, K));
    AlignedBuf<uint8_t> as(matmul_scratch_bytes(MatmulKernel::AmxInt8, M, K));
    run_k(MatmulKernel::Avx512Vnni, 0, N, ref, vs.data(), false);
    run_k(MatmulKernel::AmxInt8, 0, N, got, as.data(), false);
    for (size_t i = 0; i < ref.size(); ++i) {
      const bool past = int(i % ldy) >= N;
      ASSERT_EQ(std::isnan(got[i]), past) << "M=" << M << " K=" << K << " N=" << N << " at " << i;
      if (!past) {
        ASSERT_EQ(got[i], ref[i]) << "M=" << M << " K=" << K << " N=" << N << " at " << i;
      }
    }
    if (N > 17) {  // two slices on one scratch, the second reusing its copy of x
      std::vector<float> sliced(size_t(M) * ldy, std::nanf(""));
      AlignedBuf<uint8_t> ss(matmul_scratch_bytes(MatmulKernel::AmxInt8, M, K));
      run_k(MatmulKernel::AmxInt8, 0, 17, sliced, ss.data(), false);
      run_k(MatmulKernel::AmxInt8, 17, N, sliced, ss.data(), true);
      for (size_t i = 0; i < ref.size(); ++i)
        if (int(i % ldy) < N) {
          ASSERT_EQ(sliced[i], ref[i]) << "sliced M=" << M << " K=" << K << " N=" << N << " at " << i;
        }
    }
  }
}

// A kernel this process may not run (e.g. avx512_fma under ALPAMAYO_CPU_ISA=avx2: ctest conformance_avx2) is
// refused with an error naming it, never run.
TEST(FmaMatmul, UnrunnableKernelsAreRefused) {
  const Case c = make_case(2, 8, 16, 3);
  int refused = 0;
  for (MatmulKernel k : kMatmulKernels) {
    if (matmul_kernel_runnable(k)) continue;
    MatmulWeights w;
    const std::vector<int8_t> wq(c.W.size(), 1);
    const std::vector<float> scales(c.N, 1.f);
    const std::vector<uint8_t> xq(c.x.size(), 130);
    if (matmul_kernel_takes_bf16(k))
      w.pack_bf16(k, c.W.data(), c.K, c.N);
    else
      w.pack_s8(k, wq.data(), scales.data(), c.K, c.N);
    AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, c.M, c.K));
    std::vector<float> y(size_t(c.M) * c.N);
    try {
      run_matmul(w, matmul_kernel_takes_bf16(k) ? static_cast<const void*>(c.x.data()) : xq.data(), c.M, c.K, y.data(),
                 c.N, scratch.data());
      ADD_FAILURE() << matmul_kernel_name(k) << " ran although not runnable";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(matmul_kernel_name(k)), std::string::npos) << e.what();
      ++refused;
    }
  }
  if (refused == 0) std::printf("  every kernel runs here: nothing to refuse\n");
}

TEST(FmaMatmul, KernelNamesAndEmptyCalls) {
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::Avx512), "avx512_fma");
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::Avx2), "avx2_fma");
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::Portable), "portable_fma");
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::Avx512Vnni), "avx512_vnni");
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::Avx512Bf16), "avx512_bf16");
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::Avx2Int8), "avx2_int8");
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::AmxBf16), "amx_bf16");
  EXPECT_STREQ(matmul_kernel_instruction(MatmulKernel::AmxBf16), "tdpbf16ps tmm");
  EXPECT_EQ(matmul_kernel_runnable(MatmulKernel::AmxBf16), isa().has(kAvx512 | kAmxBf16));
  EXPECT_STREQ(matmul_kernel_name(MatmulKernel::AmxInt8), "amx_int8");
  EXPECT_STREQ(matmul_kernel_instruction(MatmulKernel::AmxInt8), "tdpbusd tmm");
  EXPECT_EQ(matmul_kernel_runnable(MatmulKernel::AmxInt8), isa().has(kAvx512 | kAmxInt8));
  EXPECT_FALSE(matmul_kernel_takes_bf16(MatmulKernel::AmxInt8));
  EXPECT_EQ(matmul_k_group(MatmulKernel::AmxInt8), 4);
  EXPECT_EQ(matmul_k_span(MatmulKernel::AmxInt8), kDotKSpan);
  for (MatmulKernel k : kMatmulKernels) {  // names round-trip; every kernel but the portable one names its instruction
    MatmulKernel back = k == MatmulKernel::Portable ? MatmulKernel::Avx2 : MatmulKernel::Portable;
    EXPECT_TRUE(matmul_kernel_from_name(matmul_kernel_name(k), &back));
    EXPECT_EQ(back, k);
    EXPECT_EQ(std::string(matmul_kernel_instruction(k)).empty(), k == MatmulKernel::Portable) << matmul_kernel_name(k);
    EXPECT_EQ(matmul_kernel_unavailable(k).empty(), matmul_kernel_runnable(k)) << matmul_kernel_name(k);
  }
  MatmulKernel unknown = MatmulKernel::Avx2;
  EXPECT_FALSE(matmul_kernel_from_name("onednn", &unknown));
  EXPECT_EQ(unknown, MatmulKernel::Avx2);
  EXPECT_TRUE(matmul_kernel_runnable(MatmulKernel::Portable));
  MatmulWeights empty;  // N == 0: nothing happens
  float y = 7.f;
  run_matmul(empty, nullptr, 4, 4, &y, 1, nullptr);
  EXPECT_EQ(y, 7.f);
}

}  // namespace
}  // namespace alpamayo::cpu
