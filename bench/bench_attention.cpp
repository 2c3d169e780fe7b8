// Single-thread throughput of the attention kernel (one KV head: group*T query rows against S+T keys)
// next to a oneDNN bf16 matmul of similar size, timed alternately so that a noisy machine affects both:
// the ratio is the kernel's efficiency relative to oneDNN's.
#include <CLI/CLI.hpp>

#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "alpamayo/tensor.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/packed_matmul.h"
#include "backends/cpu/thread_pool.h"

using namespace alpamayo;
using namespace alpamayo::cpu;

int main(int argc, char** argv) {
  int S = 4700, T = 64, group = 2, d = 128, reps = 10;
  bool portable = false;
  CLI::App app{"attention kernel throughput"};
  app.add_option("--S", S);
  app.add_option("--T", T);
  app.add_option("--group", group);
  app.add_option("--d", d);
  app.add_option("--reps", reps);
  app.add_flag("--portable", portable);
  CLI11_PARSE(app, argc, argv);
  ScopedOmpThreads one(1);
  const AttnGeometry g = AttnGeometry::make(d, group, T);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f32_to_bf16(nd(rng));
    return v;
  };
  const auto kc = rnd(size_t(S) * d), vc = rnd(size_t(S) * d), ko = rnd(size_t(T) * d), vo = rnd(size_t(T) * d);
  AlignedBuf<uint32_t> qp(size_t(d / 2) * g.Rp);
  for (size_t i = 0; i < qp.size(); ++i) qp[i] = f32_to_bf16(nd(rng)) | (uint32_t(f32_to_bf16(nd(rng))) << 16);
  AlignedBuf<float> O(size_t(g.Rp) * g.dp), m(g.Rp), l(g.Rp);
  AttnScratch sc;
  sc.resize(g);
  const KeyRows kv{kc.data(), vc.data(), S, ko.data(), vo.data()};
  const double attn_flop = 4.0 * g.R * (S + T) * d;

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  MatmulKernels kernels(eng);
  const int M = 64, K = 1536, N = 6144;
  std::vector<float> W(size_t(N) * K);
  for (auto& x : W) x = nd(rng) * 0.02f;
  PackedLinear lin;
  lin.pack(kernels, WeightType::BF16, K, N, W.data(), M, N);
  const MatmulPlan plan = lin.plan(kernels, M, N);
  AlignedBuf<uint16_t> x(size_t(M) * K);
  AlignedBuf<float> y(size_t(M) * N);
  AlignedBuf<uint8_t> scratch(plan.scratch_bytes() + 1);
  const double mm_flop = 2.0 * M * K * N;

  double ta = 0, tm = 0;
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  for (int r = 0; r <= reps; ++r) {
    const double t0 = now();
    init_partial(g, O.data(), m.data(), l.data());
    attend_chunk(!portable && cpu_has_avx512_bf16(), g, qp.data(), kv, 0, S + T, O.data(), m.data(), l.data(), sc);
    const double t1 = now();
    lin.run(st, plan, x.data(), y.data(), scratch.data());
    const double t2 = now();
    if (r == 0) continue;  // warm-up
    ta += t1 - t0;
    tm += t2 - t1;
  }
  ta /= reps;
  tm /= reps;
  std::printf("attention R=%d d=%d keys=%d: %.3f ms, %.1f GFLOP/s | oneDNN bf16 matmul %dx%dx%d: %.3f ms, %.1f GFLOP/s"
              " | attention/matmul efficiency %.2f\n",
              g.R, d, S + T, ta * 1e3, attn_flop / ta / 1e9, M, K, N, tm * 1e3, mm_flop / tm / 1e9,
              (attn_flop / ta) / (mm_flop / tm));
  return 0;
}
