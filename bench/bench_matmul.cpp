// Throughput of the expert's weight matmuls (M = B*T rows) on oneDNN, as packed by the cpu backend:
// per-thread column slices run single-threaded from our pool ("pool") versus one matmul threaded by
// oneDNN's own OpenMP runtime ("omp"), for bf16 and int8 weights, and the same pool slices on each of our kernels
// that runs here and takes the weights. The "pool" times include one pool dispatch per call (a step has one per
// step). Then, single-threaded, which oneDNN implementation
// the attribute choices the backend avoids would get (--study), and what cold weights cost (--cold).
// --block: one thread's slices on the block-format kernels (bfp_matmul.h: bf16 pairs, bfp8_b, bfp4_b, AVX512-BF16
// and portable) against oneDNN bf16, hot and cold weights.
// --stream: the weights streamed from memory as a step streams them: every thread runs its own column slices of
// the four linears of --layers layers (far more bytes than the last-level cache), M rows, on oneDNN and on each of
// our kernels that takes the weights; the weight bytes per second of the threads' own CPU time, against the
// streaming read bandwidth measured the same way in the same process (peaks.h, read_bandwidth_gbs).
// --fma: one thread's slices: oneDNN bf16 vs the fp32-FMA kernels (matmul_kernels.h: avx512_fma, avx2_fma), hot and cold
// weights, with the single-thread fp32 FMA peak (a register-only vfmadd231ps loop) for scale; then the same for int8
// weights (oneDNN u8 x s8 vs avx512_vnni and the fp32-FMA kernels on s8 weights).
#include <CLI/CLI.hpp>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <vector>

#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/runtime/aligned.h"
#include "backends/cpu/matmul/bfp_matmul.h"
#include "backends/cpu/matmul/matmul_kernels.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/matmul/onednn_matmul.h"
#include "backends/cpu/profile/peaks.h"
#include "backends/cpu/runtime/thread_pool.h"

using namespace alpamayo::cpu;

namespace {

// One oneDNN matmul M x K x N with the given source type, destination stride and runtime output scales.
void study_one(const dnnl::engine& eng, int M, int K, int N, dnnl::memory::data_type src_t,
               dnnl::memory::data_type wei_t, int ldy, bool runtime_scales, int reps) {
  using dnnl::memory;
  const memory::desc src({M, K}, src_t, memory::dims{K, 1}), wei({K, N}, wei_t, memory::format_tag::any),
      dst({M, N}, memory::data_type::f32, memory::dims{ldy, 1});
  dnnl::primitive_attr attr;
  if (runtime_scales) attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), attr, eng);
  dnnl::matmul mm(pd);
  memory ms(src, eng), mw(pd.weights_desc(), eng), md(memory::desc({M, ldy}, memory::data_type::f32, memory::format_tag::ab), eng),
      sc(memory::desc({N}, memory::data_type::f32, memory::format_tag::a), eng);
  memory mdv(dst, eng, md.get_data_handle());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, mdv}};
  if (runtime_scales) args[DNNL_ARG_ATTR_OUTPUT_SCALES] = sc;
  dnnl::stream st(eng);
  mm.execute(st, args);
  st.wait();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) mm.execute(st, args);
  st.wait();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf("study %dx%dx%d src %-4s ldy %-5d runtime scales %d: %7.3f ms %7.1f G(FL)OP/s  impl %s\n", M, K, N,
              src_t == memory::data_type::bf16 ? "bf16" : src_t == memory::data_type::u8 ? "u8" : "s8", ldy,
              int(runtime_scales), sec * 1e3, 2.0 * M * K * N / sec / 1e9, pd.impl_info_str());
}

// Single-threaded per-thread slices of the seed on 2 threads, weights cold (a 256 MB buffer is swept
// before each call, as the step's 64 layers sweep 4.8 GB) versus hot (the same call repeated).
void cold_vs_hot(const dnnl::engine& eng, int M, int reps) {
  OnednnPrimitives kernels(eng);
  dnnl::stream st(eng);
  ScopedOmpThreads one(1);
  struct Shape { const char* name; int K, N; };
  const Shape shapes[] = {{"qkv slice", 1536, 2048}, {"o slice", 2048, 768}, {"gate_up slice", 1536, 6144},
                          {"down slice", 6144, 768}};
  std::vector<char> sweep(size_t(256) << 20, 1);
  long sink = 0;
  for (const Shape& sh : shapes) {
    const std::vector<float> W(size_t(sh.N) * sh.K, 0.01f);
    OnednnLinear lin;
    lin.pack(kernels, WeightType::BF16, sh.K, sh.N, W.data(), M, sh.N);
    const OnednnPlan plan = lin.plan(kernels, M, sh.N);
    AlignedBuf<uint16_t> x(size_t(M) * sh.K);
    AlignedBuf<float> y(size_t(M) * sh.N);
    AlignedBuf<uint8_t> scratch(plan.scratch_bytes() + 1);
    double cold = 0, hot = 0;
    for (int r = 0; r < reps; ++r) {
      for (size_t i = 0; i < sweep.size(); i += 64) sink += sweep[i]++;
      const auto t0 = std::chrono::steady_clock::now();
      lin.run(st, plan, x.data(), y.data(), scratch.data());
      const auto t1 = std::chrono::steady_clock::now();
      lin.run(st, plan, x.data(), y.data(), scratch.data());
      const auto t2 = std::chrono::steady_clock::now();
      cold += std::chrono::duration<double>(t1 - t0).count();
      hot += std::chrono::duration<double>(t2 - t1).count();
    }
    std::printf("bf16 %-14s M=%d: cold %.3f ms, hot %.3f ms, cold/hot %.2f\n", sh.name, M, cold / reps * 1e3,
                hot / reps * 1e3, cold / hot);
  }
  if (sink == 42) std::printf(" \n");
}

// One thread's slices of the seed on 2 threads: oneDNN bf16 vs the block kernels, weights hot (the same call
// repeated) and cold (a 256 MB sweep before each call). Rates count the matmul's 2*M*K*N.
void block_kernels(const dnnl::engine& eng, int M, int reps) {
  OnednnPrimitives kernels(eng);
  dnnl::stream st(eng);
  ScopedOmpThreads one(1);
  struct Shape { const char* name; int K, N; };
  const Shape shapes[] = {{"qkv slice", 1536, 2048}, {"o slice", 2048, 768}, {"gate_up slice", 1536, 6144},
                          {"down slice", 6144, 768}};
  std::vector<char> sweep(size_t(256) << 20, 1);
  long sink = 0;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (const Shape& sh : shapes) {
    std::vector<float> W(size_t(sh.N) * sh.K);
    for (auto& v : W) v = nd(rng);
    AlignedBuf<uint16_t> x(size_t(M) * sh.K);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0x3f80;  // 1.0
    AlignedBuf<float> y(size_t(M) * sh.N);
    const double flop = 2.0 * M * sh.K * sh.N;
    auto time = [&](const char* what, const std::function<void()>& fn) {
      double cold = 0, hot = 0;
      fn();
      for (int r = 0; r < reps; ++r) {
        for (size_t i = 0; i < sweep.size(); i += 64) sink += sweep[i]++;
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        const auto t1 = std::chrono::steady_clock::now();
        fn();
        const auto t2 = std::chrono::steady_clock::now();
        cold += std::chrono::duration<double>(t1 - t0).count();
        hot += std::chrono::duration<double>(t2 - t1).count();
      }
      std::printf("%-14s %-22s M=%d: hot %7.3f ms %6.1f GFLOP/s, cold %7.3f ms %6.1f GFLOP/s\n", sh.name, what, M,
                  hot / reps * 1e3, flop / (hot / reps) / 1e9, cold / reps * 1e3, flop / (cold / reps) / 1e9);
    };
    OnednnLinear lin;
    lin.pack(kernels, WeightType::BF16, sh.K, sh.N, W.data(), M, sh.N);
    const OnednnPlan plan = lin.plan(kernels, M, sh.N);
    AlignedBuf<uint8_t> scratch(std::max(plan.scratch_bytes(), block_scratch_bytes()) + 1);
    time("oneDNN bf16", [&] { lin.run(st, plan, x.data(), y.data(), scratch.data()); });
    for (BlockStore bs : {BlockStore::BF16, BlockStore::BFP8_B, BlockStore::BFP4_B}) {
      BlockWeights bw;
      bw.pack(bs, W.data(), sh.K, sh.N);
      static const char* names[] = {"bf16 pairs", "bfp8_b", "bfp4_b"};
      for (BlockKernel k : {BlockKernel::Avx512Bf16, BlockKernel::Portable}) {
        if (k == BlockKernel::Avx512Bf16 && !block_kernel_avx512_available()) continue;
        if (k == BlockKernel::Portable && bs != BlockStore::BFP8_B) continue;
        const std::string what = std::string("block ") + names[int(bs)] + (k == BlockKernel::Portable ? " portable" : "");
        time(what.c_str(), [&] { block_matmul(k, bw, x.data(), M, sh.K, y.data(), sh.N, scratch.data()); });
      }
    }
  }
  if (sink == 42) std::printf(" \n");
}


// Single-thread fp32 FMA peak: 12 independent accumulator chains of vfmadd231ps (zmm or ymm), registers only.
__attribute__((target("avx512f"), noinline)) double fma_peak_avx512(long iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(float(i));
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return 12.0 * 16 * 2 * iters / sec / 1e9;
}
__attribute__((target("avx2,fma"), noinline)) double fma_peak_avx2(long iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float out[8];
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  _mm256_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return 12.0 * 8 * 2 * iters / sec / 1e9;
}

// One thread's slices of the seed on 2 threads: oneDNN bf16 vs the fp32-FMA kernels, hot and cold weights.
void fma_kernels(const dnnl::engine& eng, int M, int reps) {
  OnednnPrimitives kernels(eng);
  dnnl::stream st(eng);
  ScopedOmpThreads one(1);
  std::printf("CPU features: %s\n", isa().describe().c_str());
  // Best of 20 short runs: the machine may be shared.
  double pz = 0, py = 0;
  for (int r = 0; r < 20; ++r) {
    if (isa().has(kAvx512)) pz = std::max(pz, fma_peak_avx512(2000000));
    if (isa().has(kAvx2Fma)) py = std::max(py, fma_peak_avx2(2000000));
  }
  if (pz > 0) std::printf("fp32 FMA peak, 1 thread, zmm: %.1f GFLOP/s\n", pz);
  if (py > 0) std::printf("fp32 FMA peak, 1 thread, ymm: %.1f GFLOP/s\n", py);
  struct Shape { const char* name; int K, N; };
  const Shape shapes[] = {{"qkv slice", 1536, 2048}, {"o slice", 2048, 768}, {"gate_up slice", 1536, 6144},
                          {"down slice", 6144, 768}};
  std::vector<char> sweep(size_t(256) << 20, 1);
  long sink = 0;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (const Shape& sh : shapes) {
    std::vector<float> W(size_t(sh.N) * sh.K);
    for (auto& v : W) v = nd(rng);
    AlignedBuf<uint16_t> x(size_t(M) * sh.K);
    for (size_t i = 0; i < x.size(); ++i) x[i] = alpamayo::f32_to_bf16(nd(rng));
    AlignedBuf<float> y(size_t(M) * sh.N);
    const double flop = 2.0 * M * sh.K * sh.N;
    // Double-precision reference of columns [0, 64) (bf16 operands, exact products, double sums) for the
    // accuracy line after each kernel.
    const int nref = std::min(sh.N, 64);
    std::vector<double> ref(size_t(M) * nref);
    double ref_max = 0;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < nref; ++n) {
        double acc = 0;
        for (int k = 0; k < sh.K; ++k)
          acc += double(alpamayo::bf16_to_f32(x[size_t(m) * sh.K + k])) *
                 alpamayo::bf16_to_f32(alpamayo::f32_to_bf16(W[size_t(n) * sh.K + k]));
        ref[size_t(m) * nref + n] = acc;
        ref_max = std::max(ref_max, std::fabs(acc));
      }
    auto accuracy = [&](const char* what) {
      double err = 0;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < nref; ++n) err = std::max(err, std::fabs(y[size_t(m) * sh.N + n] - ref[size_t(m) * nref + n]));
      std::printf("%-14s K=%-5d %-12s max |y - double ref| = %.3g (max |ref| %.3g)\n", sh.name, sh.K, what, err, ref_max);
    };
    auto time = [&](const char* what, const std::function<void()>& fn) {
      double cold = 0, hot = 1e30;
      fn();
      for (int r = 0; r < reps; ++r) {
        for (size_t i = 0; i < sweep.size(); i += 64) sink += sweep[i]++;
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        const auto t1 = std::chrono::steady_clock::now();
        fn();
        const auto t2 = std::chrono::steady_clock::now();
        cold += std::chrono::duration<double>(t1 - t0).count();
        hot = std::min(hot, std::chrono::duration<double>(t2 - t1).count());
      }
      std::printf("%-14s K=%-5d N=%-5d %-15s M=%d: hot %7.3f ms %6.1f GFLOP/s, cold %7.3f ms %6.1f GFLOP/s\n", sh.name,
                  sh.K, sh.N, what, M, hot * 1e3, flop / hot / 1e9, cold / reps * 1e3, flop / (cold / reps) / 1e9);
    };
    try {
      OnednnLinear lin;
      lin.pack(kernels, WeightType::BF16, sh.K, sh.N, W.data(), M, sh.N);
      const OnednnPlan plan = lin.plan(kernels, M, sh.N);
      AlignedBuf<uint8_t> scratch(plan.scratch_bytes() + 1);
      time("onednn", [&] { lin.run(st, plan, x.data(), y.data(), scratch.data()); });
      accuracy("onednn");
    } catch (const std::exception& e) {
      std::printf("%-14s onednn: unavailable (%s)\n", sh.name, e.what());
    }
    for (MatmulKernel k : {MatmulKernel::Avx512Bf16, MatmulKernel::Avx512, MatmulKernel::Avx2}) {
      if (!matmul_kernel_runnable(k)) {
        std::printf("%-14s %s: not runnable here\n", sh.name, matmul_kernel_name(k));
        continue;
      }
      MatmulWeights fw;
      fw.pack(k, W.data(), sh.K, sh.N);
      AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, M, sh.K));
      time(matmul_kernel_name(k), [&] { run_matmul(fw, x.data(), M, sh.K, y.data(), sh.N, scratch.data()); });
      accuracy(matmul_kernel_name(k));
    }
    // int8 weights (u8 activations; rates in GOP/s, same 2*M*K*N count): oneDNN's VNNI kernel vs the same
    // fp32-FMA kernels on s8 weights.
    AlignedBuf<uint8_t> xq(size_t(M) * sh.K);
    for (size_t i = 0; i < xq.size(); ++i) xq[i] = static_cast<uint8_t>(rng() % 255 + 1);
    try {
      OnednnLinear lin;
      lin.pack(kernels, WeightType::INT8, sh.K, sh.N, W.data(), M, sh.N);
      const OnednnPlan plan = lin.plan(kernels, M, sh.N);
      AlignedBuf<uint8_t> scratch(plan.scratch_bytes() + 1);
      time("int8 onednn", [&] { lin.run(st, plan, xq.data(), y.data(), scratch.data()); });
    } catch (const std::exception& e) {
      std::printf("%-14s int8 onednn: unavailable (%s)\n", sh.name, e.what());
    }
    for (MatmulKernel k : {MatmulKernel::Avx512Vnni, MatmulKernel::AmxInt8, MatmulKernel::Avx2Int8, MatmulKernel::Avx512,
                           MatmulKernel::Avx2}) {
      if (!matmul_kernel_runnable(k)) continue;
      MatmulWeights fw;
      fw.pack_int8(k, W.data(), sh.K, sh.N);
      AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, M, sh.K));
      const std::string what = std::string("int8 ") + matmul_kernel_name(k);
      time(what.c_str(), [&] { run_matmul(fw, xq.data(), M, sh.K, y.data(), sh.N, scratch.data()); });
    }
  }
  if (sink == 42) std::printf(" \n");
}

// One kernel's pass over every layer's slices on every pool thread, `reps` times after one untimed pass.
// Returns {GB/s of the threads' CPU time (summed over threads), GB/s of wall time}.
std::pair<double, double> stream_rate(ThreadPool& pool, const std::function<void(int, int)>& layer_pass, int layers,
                                      double gbytes_per_pass, int reps) {
  const int T = pool.size();
  std::vector<double> cpu(T, 0.0);
  pool.run([&](int t) { for (int l = 0; l < layers; ++l) layer_pass(t, l); });
  const auto w0 = std::chrono::steady_clock::now();
  pool.run([&](int t) {
    const double c0 = thread_cpu_seconds();
    for (int r = 0; r < reps; ++r)
      for (int l = 0; l < layers; ++l) layer_pass(t, l);
    cpu[t] = thread_cpu_seconds() - c0;
  });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  double rate = 0;
  for (int t = 0; t < T; ++t) rate += gbytes_per_pass * reps / T / std::max(cpu[t], 1e-9);
  return {rate, gbytes_per_pass * reps / wall};
}

// Longer than most functions here: the oneDNN pass and our kernels' pass share the weights, activations, slices and
// the bandwidth measured once; split, each would take a dozen of them as parameters.
void stream(const dnnl::engine& eng, int M, int threads, int layers, int reps) {
  struct Shape { const char* name; int K, N; };
  const Shape shapes[] = {{"qkv", 1536, 4096}, {"o", 2048, 1536}, {"gate_up", 1536, 12288}, {"down", 6144, 1536}};
  ThreadPool pool(threads);
  std::printf("CPU features: %s; %d threads, M=%d, %d layers\n", isa().describe().c_str(), threads, M, layers);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<std::vector<float>> W;
  for (const Shape& sh : shapes) {
    W.emplace_back(size_t(sh.N) * sh.K);
    for (auto& v : W.back()) v = nd(rng);
  }
  AlignedBuf<uint16_t> x(size_t(M) * 6144);
  for (size_t i = 0; i < x.size(); ++i) x[i] = alpamayo::f32_to_bf16(nd(rng));
  AlignedBuf<uint8_t> xq(size_t(M) * 6144);
  for (size_t i = 0; i < xq.size(); ++i) xq[i] = uint8_t(128 + int(rng() % 61) - 30);
  std::vector<AlignedBuf<float>> y(threads);
  for (auto& b : y) b.resize(size_t(M) * 12288);
  const double read = read_bandwidth_gbs(threads);
  std::printf("streaming read bandwidth: %.1f GB/s (%d threads)\n", read, threads);
  auto col0 = [&](int s, int t) { return shapes[s].N * t / threads; };
  auto cols = [&](int s, int t) { return shapes[s].N * (t + 1) / threads - col0(s, t); };
  for (WeightType wt : {WeightType::BF16, WeightType::INT8}) {
    const bool i8 = wt == WeightType::INT8;
    double gb = 0;
    for (const Shape& sh : shapes) gb += double(sh.K) * sh.N * (i8 ? 1 : 2) * layers * 1e-9;
    auto report = [&](const char* what, std::pair<double, double> r) {
      std::printf("%s %-12s M=%-4d %.3f GB/pass: %6.1f GB/s (CPU time) = %5.1f%% of the read bandwidth; %6.1f GB/s "
                  "wall\n", i8 ? "int8" : "bf16", what, M, gb, r.first, 100.0 * r.first / read, r.second);
    };
    {  // oneDNN, as the backend runs it: a slice per thread, single-threaded oneDNN
      OnednnPrimitives kernels(eng);
      std::vector<std::vector<OnednnLinear>> lin(size_t(threads) * layers, std::vector<OnednnLinear>(4));
      std::vector<std::vector<OnednnPlan>> plan(size_t(threads) * layers, std::vector<OnednnPlan>(4));
      std::vector<AlignedBuf<uint8_t>> scratch(threads);
      std::vector<dnnl::stream> st;
      for (int t = 0; t < threads; ++t) st.emplace_back(eng);
      try {
        pool.run([&](int t) {
          ScopedOmpThreads one(1);
          size_t need = 1;
          for (int l = 0; l < layers; ++l)
            for (int s = 0; s < 4; ++s) {
              const size_t i = size_t(t) * layers + l;
              lin[i][s].pack(kernels, wt, shapes[s].K, cols(s, t), W[s].data() + size_t(col0(s, t)) * shapes[s].K, M,
                             cols(s, t));
              plan[i][s] = lin[i][s].plan(kernels, M, cols(s, t));
              need = std::max(need, plan[i][s].scratch_bytes());
            }
          scratch[t].resize(need);
        });
        report("onednn", stream_rate(pool, [&](int t, int l) {
          ScopedOmpThreads one(1);
          for (int s = 0; s < 4; ++s)
            lin[size_t(t) * layers + l][s].run(st[t], plan[size_t(t) * layers + l][s], i8 ? (const void*)xq.data()
                                                                                              : (const void*)x.data(),
                                               y[t].data(), scratch[t].data());
        }, layers, gb, reps));
      } catch (const alpamayo::Error& e) {
        std::printf("%s onednn unavailable: %s\n", i8 ? "int8" : "bf16", e.what());
      }
    }
    for (MatmulKernel k : kMatmulKernels) {
      if (k == MatmulKernel::Portable || !matmul_kernel_runnable(k) || !matmul_kernel_refuses(k, i8, 6144).empty() ||
          k == MatmulKernel::Avx2 || k == MatmulKernel::Avx2Int8)
        continue;
      std::vector<std::vector<MatmulWeights>> mw(size_t(threads) * layers, std::vector<MatmulWeights>(4));
      std::vector<AlignedBuf<uint8_t>> scratch(threads);
      pool.run([&](int t) {
        for (int l = 0; l < layers; ++l)
          for (int s = 0; s < 4; ++s) {
            const float* src = W[s].data() + size_t(col0(s, t)) * shapes[s].K;
            if (i8) mw[size_t(t) * layers + l][s].pack_int8(k, src, shapes[s].K, cols(s, t));
            else mw[size_t(t) * layers + l][s].pack(k, src, shapes[s].K, cols(s, t));
          }
        scratch[t].resize(matmul_scratch_bytes(k, M, 6144));
      });
      report(matmul_kernel_name(k), stream_rate(pool, [&](int t, int l) {
        for (int s = 0; s < 4; ++s)
          run_matmul(mw[size_t(t) * layers + l][s], i8 ? (const void*)xq.data() : (const void*)x.data(), M,
                     shapes[s].K, y[t].data(), cols(s, t), scratch[t].data());
      }, layers, gb, reps));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int M = 64, threads = 2, reps = 20;
  bool study = false, cold = false, block = false, fma = false, streamed = false;
  int layers = 24;
  CLI::App app{"oneDNN matmul throughput for the expert's shapes"};
  app.add_option("--M", M, "rows (B*T)");
  app.add_option("--threads", threads, "threads");
  app.add_option("--reps", reps, "repetitions");
  app.add_flag("--study", study, "only the single-thread oneDNN attribute study");
  app.add_flag("--cold", cold, "only single-thread slices with cold versus hot weights");
  app.add_flag("--block", block, "only single-thread slices: oneDNN bf16 vs the block-format kernels");
  app.add_flag("--fma", fma, "only single-thread slices: oneDNN bf16 vs the fp32-FMA kernels (avx512_fma, avx2_fma)");
  app.add_flag("--stream", streamed, "only the weights of --layers layers streamed from memory, per kernel, against "
               "the read bandwidth");
  app.add_option("--layers", layers, "with --stream: layers of weights (their bytes must dwarf the last-level cache)");
  CLI11_PARSE(app, argc, argv);
  struct Shape { const char* name; int K, N; };
  const Shape shapes[] = {{"qkv 1536->4096", 1536, 4096}, {"o 2048->1536", 2048, 1536},
                          {"gate_up 1536->12288", 1536, 12288}, {"down 6144->1536", 6144, 1536}};
  // ALPAMAYO_CPU_ISA caps everything this program runs, oneDNN too (before its first primitive).
  alpamayo::BackendOptions env;
  alpamayo::options_from_environment(env, "cpu");
  set_isa_ceiling(env.isa_cap, env.isa_cap_source);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  if (streamed) {
    stream(eng, M, threads, layers, reps < 3 ? reps : 3);
    return 0;
  }
  if (fma) {
    fma_kernels(eng, M, reps < 5 ? reps : 5);
    return 0;
  }
  if (block) {
    block_kernels(eng, M, reps < 5 ? reps : 5);
    return 0;
  }
  if (cold) {
    cold_vs_hot(eng, M, reps < 5 ? reps : 5);
    return 0;
  }
  if (study) {
    ScopedOmpThreads one(1);
    using dt = dnnl::memory::data_type;
    const int K = 1536, N = 3072;  // one thread's gate_up slice on 2 threads
    study_one(eng, M, K, 2 * N, dt::bf16, dt::bf16, 2 * N, false, reps);
    study_one(eng, M, K, 2 * N, dt::bf16, dt::bf16, 4 * N, false, reps);
    study_one(eng, M, K, 2 * N, dt::u8, dt::s8, 2 * N, false, reps);
    study_one(eng, M, K, 2 * N, dt::u8, dt::s8, 4 * N, false, reps);
    study_one(eng, M, K, 2 * N, dt::u8, dt::s8, 2 * N, true, reps);
    study_one(eng, M, K, 2 * N, dt::s8, dt::s8, 2 * N, false, reps);
    study_one(eng, M, K, 2 * N, dt::s8, dt::s8, 2 * N, true, reps);
    return 0;
  }
  OnednnPrimitives kernels(eng);
  ThreadPool pool(threads);
  std::vector<dnnl::stream> streams;
  for (int t = 0; t < threads; ++t) streams.emplace_back(eng);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (WeightType wt : {WeightType::BF16, WeightType::INT8}) {
    for (const Shape& s : shapes) {
      std::vector<float> W(size_t(s.N) * s.K);
      for (auto& x : W) x = nd(rng);
      AlignedBuf<uint16_t> x(size_t(M) * s.K);
      AlignedBuf<float> y(size_t(M) * s.N);
      const double flop = 2.0 * M * s.K * s.N;
      std::vector<std::pair<const char*, std::function<void()>>> modes;
      // pool: one slice per thread, single-threaded oneDNN in each; omp: one matmul, oneDNN threads it itself.
      // Skipped where oneDNN has no such matmul (bf16 below AVX-512).
      std::vector<OnednnLinear> slices(threads);
      std::vector<OnednnPlan> plans(threads);
      std::vector<AlignedBuf<uint8_t>> scratch(threads);
      OnednnLinear whole;
      OnednnPrimitives omp_kernels(eng);
      AlignedBuf<uint8_t> wscratch;
      OnednnPlan wplan;
      try {
        {
          ScopedOmpThreads one(1);
          for (int t = 0; t < threads; ++t) {
            const int n0 = s.N * t / threads, n1 = s.N * (t + 1) / threads;
            // Dense per-thread destinations: with a strided one (ldy = N) oneDNN 2.6 leaves brgemm.
            slices[t].pack(kernels, wt, s.K, n1 - n0, W.data() + size_t(n0) * s.K, M, n1 - n0);
            plans[t] = slices[t].plan(kernels, M, n1 - n0);
          }
        }
        for (int t = 0; t < threads; ++t) scratch[t].resize(plans[t].scratch_bytes() + 1);
        {
          ScopedOmpThreads n(threads);
          whole.pack(omp_kernels, wt, s.K, s.N, W.data(), M, s.N);
          wplan = whole.plan(omp_kernels, M, s.N);
          wscratch.resize(wplan.scratch_bytes() + 1);
        }
        modes.emplace_back("pool", [&] {
          ScopedOmpThreads one(1);
          pool.run([&](int t) {
            slices[t].run(streams[t], plans[t], x.data(), y.data() + size_t(M) * (s.N * t / threads), scratch[t].data());
          });
        });
        modes.emplace_back("omp", [&] {
          ScopedOmpThreads n(threads);
          whole.run(streams[0], wplan, x.data(), y.data(), wscratch.data());
        });
      } catch (const alpamayo::Error& e) {
        std::printf("%-5s %-20s onednn     unavailable: %s\n", wt == WeightType::BF16 ? "bf16" : "int8", s.name, e.what());
      }
      // The same pool slices on our kernels (matmul_kernels.h) that take these weights and run here.
      std::vector<std::vector<MatmulWeights>> fma_slices;
      std::vector<AlignedBuf<uint8_t>> fma_scratch(threads);
      for (MatmulKernel k : kMatmulKernels) {
        const bool i8 = wt == WeightType::INT8;
        if (k == MatmulKernel::Portable || !matmul_kernel_runnable(k) || !matmul_kernel_refuses(k, i8, s.K).empty()) continue;
        std::vector<MatmulWeights>& fs = fma_slices.emplace_back(threads);
        for (int t = 0; t < threads; ++t) {
          const int n0 = s.N * t / threads, n1 = s.N * (t + 1) / threads;
          if (i8) fs[t].pack_int8(k, W.data() + size_t(n0) * s.K, s.K, n1 - n0);
          else fs[t].pack(k, W.data() + size_t(n0) * s.K, s.K, n1 - n0);
          if (fma_scratch[t].size() < matmul_scratch_bytes(k, M, s.K)) fma_scratch[t].resize(matmul_scratch_bytes(k, M, s.K));
        }
      }
      for (size_t i = 0; i < fma_slices.size(); ++i) {
        const std::vector<MatmulWeights>* fs = &fma_slices[i];
        modes.emplace_back(matmul_kernel_name(fma_slices[i][0].kernel()), [&, fs] {
          pool.run([&](int t) {
            const int n0 = s.N * t / threads;
            run_matmul((*fs)[t], x.data(), M, s.K, y.data() + size_t(M) * n0, (*fs)[t].N(), fma_scratch[t].data());
          });
        });
      }
      for (auto& [mode, fn] : modes) {
        fn();
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) fn();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
        std::printf("%-5s %-20s %-10s M=%d threads=%d: %8.3f ms  %7.1f G%s/s\n", wt == WeightType::BF16 ? "bf16" : "int8",
                    s.name, mode, M, threads, sec * 1e3, flop / sec / 1e9, wt == WeightType::BF16 ? "FLOP" : "OP");
      }
    }
  }
  return 0;
}
