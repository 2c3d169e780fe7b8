// Single-thread throughput of every attention kernel this machine can run (one KV head: group*T query rows
// against S+T keys), each next to a oneDNN bf16 matmul of similar size, timed alternately so that a noisy
// machine affects both: the ratio is the kernel's efficiency relative to oneDNN's. Also prints the
// single-thread peak of the instruction each kernel multiplies with, and which kernel the backend's
// selection (select_attention_kernel) takes for this shape. --kernel NAME runs one kernel only; --kv int8 runs
// the kernels that read an int8 cache on one (every row quantised, kv_int8.h). --page N reads the bf16 cache rows
// through a page table instead (pages of N rows in a shuffled pool, rows 8 heads apart as in an NHD pool): the
// kernels' addressing of a paged cache (RowMap, key_row_ptrs) against the dense run.
#include <CLI/CLI.hpp>


#include <algorithm>
#include <bit>
#include <chrono>
#include <numeric>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/attention/attention.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/matmul/onednn_matmul.h"
#include "backends/cpu/profile/peaks.h"
#include "backends/cpu/runtime/thread_pool.h"

using namespace alpamayo;
using namespace alpamayo::cpu;

int main(int argc, char** argv) {
  int S = 4700, T = 64, group = 2, d = 128, reps = 10, caches = 1, page = 0;
  std::string only, kv = "bf16";
  CLI::App app{"attention kernel throughput"};
  app.add_option("--S", S);
  app.add_option("--T", T);
  app.add_option("--group", group);
  app.add_option("--d", d);
  app.add_option("--reps", reps);
  app.add_option("--caches", caches,
                 "separate KV caches taken in turn: 1 stays in L2/L3; 64 (150 MB at S=4700) streams the keys from "
                 "memory as a step's layers do")
      ->check(CLI::Range(1, 4096));
  app.add_option("--kernel", only, "one kernel: avx512_bf16 | avx512_vnni | avx512_fma | avx2_fma | amx_bf16 | portable");
  app.add_option("--kv", kv, "the cache: bf16 | int8")->check(CLI::IsMember({"bf16", "int8"}));
  app.add_option("--page", page, "bf16: read the cache rows through a page table, pages of this many rows (a power "
                                 "of two) in a shuffled NHD pool of 8 heads")->check(CLI::Range(0, 256));
  CLI11_PARSE(app, argc, argv);
  if (page > 0 && (kv != "bf16" || (page & (page - 1)) != 0)) {
    std::fprintf(stderr, "bench_attention: --page takes a power of two and a bf16 cache\n");
    return 1;
  }
  // ALPAMAYO_CPU_ISA caps everything this program runs, oneDNN too (before its first primitive).
  BackendOptions env;
  options_from_environment(env, "cpu");
  set_isa_ceiling(env.isa_cap, env.isa_cap_source);
  ScopedOmpThreads one(1);
  const AttnGeometry g = AttnGeometry::make(d, group, T);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f32_to_bf16(nd(rng));
    return v;
  };
  // One random cache, repeated: the contents do not matter for the timing, only the addresses.
  const auto kc1 = rnd(size_t(S) * d), vc1 = rnd(size_t(S) * d), ko = rnd(size_t(T) * d), vo = rnd(size_t(T) * d);
  std::vector<uint16_t> kc(kc1.size() * caches), vc(vc1.size() * caches);
  for (int c = 0; c < caches; ++c) {
    std::copy(kc1.begin(), kc1.end(), kc.begin() + c * kc1.size());
    std::copy(vc1.begin(), vc1.end(), vc.begin() + c * vc1.size());
  }
  // The same rows as an int8 cache (--kv int8).
  const bool int8 = kv == "int8";
  std::vector<uint8_t> k8c(int8 ? kc.size() : 0), k8o(int8 ? ko.size() : 0);
  std::vector<int8_t> v8c(int8 ? vc.size() : 0), v8o(int8 ? vo.size() : 0);
  std::vector<float> ksc(int8 ? size_t(S) * caches : 0), vsc(ksc.size()), kso(int8 ? T : 0), vso(kso.size());
  if (int8) {
    store_int8_rows(kc.data(), vc.data(), size_t(S) * caches, d, k8c.data(), v8c.data(), ksc.data(), vsc.data());
    store_int8_rows(ko.data(), vo.data(), T, d, k8o.data(), v8o.data(), kso.data(), vso.data());
  }
  AlignedBuf<uint32_t> qp(size_t(d / 2) * g.Rp);
  for (size_t i = 0; i < qp.size(); ++i) qp[i] = f32_to_bf16(nd(rng)) | (uint32_t(f32_to_bf16(nd(rng))) << 16);
  AlignedBuf<float> O(size_t(g.Rp) * g.dp), m(g.Rp), l(g.Rp);
  std::printf("isa: %s\n", isa().describe().c_str());
  std::vector<AttnKernel> kernels_run;
  if (!only.empty()) {
    try {
      kernels_run.push_back(attn_kernel_from_name(only, "--kernel", int8));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_attention: %s\n", e.what());
      return 1;
    }
  } else {
    for (AttnKernel k : kAttnKernels) {
      if (const std::string why = attn_kernel_unavailable(k, int8); !why.empty())
        std::printf("%-12s skipped: %s\n", attn_kernel_name(k), why.c_str());
      else
        kernels_run.push_back(k);
    }
  }
  // --page: every cache's rows in a shuffled pool [pages, page, 8 heads, d] (head 0 used), one table per cache.
  const int pool_heads = 8, npages = page > 0 ? (S + page - 1) / page : 0;
  std::vector<uint16_t> kpool(size_t(npages) * page * pool_heads * d * caches), vpool(kpool.size());
  std::vector<int64_t> table(size_t(npages) * caches);
  if (page > 0) {
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    for (int c = 0; c < caches; ++c)
      for (int i = 0; i < S; ++i) {
        const size_t at = (size_t(table[size_t(c) * npages + i / page]) * page + i % page) * pool_heads * d;
        std::copy_n(kc1.data() + size_t(i) * d, d, kpool.data() + at);
        std::copy_n(vc1.data() + size_t(i) * d, d, vpool.data() + at);
      }
  }
  auto rows_of = [&](int c) {
    KeyRows r;
    if (page > 0) {
      r.k_map = {kpool.data(), int64_t(pool_heads) * d, table.data() + size_t(c) * npages,
                 std::countr_zero(unsigned(page)), int64_t(page) * pool_heads * d, 0};
      r.v_map = r.k_map;
      r.v_map.base = vpool.data();
    }
    r.k_cache = page > 0 ? nullptr : kc.data() + c * kc1.size();
    r.v_cache = page > 0 ? nullptr : vc.data() + c * vc1.size();
    r.S = S;
    r.k_own = ko.data();
    r.v_own = vo.data();
    if (int8) {
      r.int8 = true;
      r.i8[0] = {k8c.data() + c * kc1.size(), v8c.data() + c * vc1.size(), ksc.data() + size_t(c) * S,
                 vsc.data() + size_t(c) * S};
      r.i8[2] = {k8o.data(), v8o.data(), kso.data(), vso.data()};
    }
    return r;
  };
  const double attn_flop = 4.0 * g.R * (S + T) * d;

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  OnednnPrimitives kernels(eng);
  const int M = 64, K = 1536, N = 6144;
  std::vector<float> W(size_t(N) * K);
  for (auto& x : W) x = nd(rng) * 0.02f;
  // The yardstick is missing where oneDNN has no bf16 matmul (below AVX-512): the kernels still run, alone.
  OnednnLinear lin;
  OnednnPlan plan;
  std::string no_matmul;
  try {
    lin.pack(kernels, WeightType::BF16, K, N, W.data(), M, N);
    plan = lin.plan(kernels, M, N);
  } catch (const Error& e) {
    no_matmul = e.what();
  }
  AlignedBuf<uint16_t> x(size_t(M) * K);
  AlignedBuf<float> y(size_t(M) * N);
  AlignedBuf<uint8_t> scratch(no_matmul.empty() ? plan.scratch_bytes() + 1 : 1);
  const double mm_flop = 2.0 * M * K * N;

  auto now = thread_cpu_seconds;  // isa.h
  const Peaks& peaks = measured_peaks(1);
  for (AttnKernel k : kernels_run) {
    AttnScratch sc;
    sc.resize(g, attn_kernel_is_fp32(k), int8, attn_kernel_is_amx(k));
    const int kreps = k == AttnKernel::Portable ? std::max(1, reps / 5) : reps;
    double ta = 0, tm = 0, ta_best = 1e30;
    for (int r = 0; r <= kreps; ++r) {
      const double t0 = now();
      init_partial(g, O.data(), m.data(), l.data());
      attend_chunk(k, g, qp.data(), rows_of(r % caches), 0, S + T, O.data(), m.data(), l.data(), sc);
      const double t1 = now();
      if (no_matmul.empty()) lin.run(st, plan, x.data(), y.data(), scratch.data());
      const double t2 = now();
      if (r == 0) continue;  // warm-up
      ta += t1 - t0;
      tm += t2 - t1;
      ta_best = std::min(ta_best, t1 - t0);
    }
    ta /= kreps;
    tm /= kreps;
    const double peak = peaks.of(attn_kernel_instruction(k));
    std::printf("%-12s attention R=%d d=%d keys=%d: %8.3f ms, %6.1f GFLOP/s", attn_kernel_name(k), g.R, d, S + T,
                ta * 1e3, attn_flop / ta / 1e9);
    if (peak > 0)
      std::printf(" = %4.1f%% of %s peak %.1f", 100.0 * attn_flop / ta / 1e9 / peak, attn_kernel_instruction(k), peak);
    std::printf(" (best run %.3f ms, %.1f%%)", ta_best * 1e3,
                peak > 0 ? 100.0 * attn_flop / ta_best / 1e9 / peak : 0.0);
    if (no_matmul.empty())
      std::printf(" | oneDNN bf16 matmul %dx%dx%d: %.3f ms, %.1f GFLOP/s | attention/matmul %.2f\n", M, K, N,
                  tm * 1e3, mm_flop / tm / 1e9, (attn_flop / ta) / (mm_flop / tm));
    else
      std::printf(" | no oneDNN bf16 matmul here (%s)\n", no_matmul.c_str());
  }
  std::printf("peaks (1 thread):");
  for (const PeakEntry& e : peaks.entries)
    if (e.rate > 0) std::printf("  %s %.1f %s", e.instruction.c_str(), e.rate, e.unit.c_str());
  std::printf("\n");
  if (only.empty()) {
    KernelChoices made;
    const KernelScope scope{isa(), env.kernels, env.kernels_source};  // ALPAMAYO_CPU_KERNELS forces it
    const AttnKernel chosen = select_attention_kernel(d, group, T, 2048, int8, scope, &made);
    for (const KernelChoice& c : made)
      if (c.op == (int8 ? "attention_kv_int8" : "attention"))
        std::printf("selected: %s (%s%s%s)\n", attn_kernel_name(chosen), c.why.c_str(), c.check.empty() ? "" : "; ",
                    c.check.c_str());
  }
  return 0;
}
