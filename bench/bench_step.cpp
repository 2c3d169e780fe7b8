// Times one denoising step (Backend::step only) of the full-size expert with random weights and a
// random bf16 VLM cache built in memory. Every layer gets its own packed copy of one random layer's
// weights (so the weight traffic is real) and its own cache rows.
// Prints the per-op table (backend profile, stderr), time per step, 10-step estimate and peak memory, and a
// final JSON line for scripts (bench/bench_vs_torch.py).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/tensor.h"

namespace {

using namespace alpamayo;

struct Rng {
  uint64_t s;
  // Roughly N(0, 1) (sum of uniforms), fast enough for gigabytes.
  float normal() {
    float acc = 0.f;
    for (int i = 0; i < 4; ++i) {
      s ^= s << 13; s ^= s >> 7; s ^= s << 17;
      acc += static_cast<float>(s >> 40) / float(1 << 24);
    }
    return (acc - 2.f) * 1.7320508f;
  }
};

std::vector<uint16_t> random_bf16(size_t n, float scale, Rng& r) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(r.normal() * scale);
  return v;
}

long vm_hwm_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  int L = 64, D = 1536, Hq = 16, Hkv = 8, d = 128, I = 6144, T = 64, S = 4700, Smax = 8192, B = 1, threads = 2,
      steps = 3, warmup = 1;
  std::string weights = "bf16", backend = "cpu";
  bool profile = true;
  CLI::App app{"Time Backend::step of the full-size expert on random weights"};
  app.add_option("--L", L, "layers");
  app.add_option("--D", D, "hidden size");
  app.add_option("--Hq", Hq, "query heads");
  app.add_option("--Hkv", Hkv, "KV heads");
  app.add_option("--d", d, "head dim");
  app.add_option("--I", I, "MLP width");
  app.add_option("--T", T, "action tokens per sample");
  app.add_option("--S", S, "valid cache rows per sample");
  app.add_option("--Smax", Smax, "cache capacity P");
  app.add_option("--B", B, "batch");
  app.add_option("--threads", threads, "threads (0: all cores)");
  app.add_option("--weights", weights, "bf16 | int8");
  app.add_option("--backend", backend, "backend name");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--profile", profile, "print the per-op table after each step (1/0)");
  CLI11_PARSE(app, argc, argv);

  try {
    Rng rng{0x9E3779B97F4A7C15ull};
    ExpertConfig cfg;
    cfg.L = L; cfg.D = D; cfg.Hq = Hq; cfg.Hkv = Hkv; cfg.d = d; cfg.I = I; cfg.T = T;
    auto mat = [&](int out, int in) { return random_bf16(size_t(out) * in, 1.f / std::sqrt(float(in)), rng); };
    auto ones = [&](int n) { return std::vector<uint16_t>(n, f32_to_bf16(1.f)); };
    const auto wq = mat(Hq * d, D), wk = mat(Hkv * d, D), wv = mat(Hkv * d, D), wo = mat(D, Hq * d),
               wg = mat(I, D), wu = mat(I, D), wd = mat(D, I), nD = ones(D), nd = ones(d);
    auto view = [](const std::vector<uint16_t>& v, std::vector<int64_t> shape) {
      return TensorView{DType::BF16, std::move(shape), v.data(), "bench"};
    };
    ExpertWeights w;
    for (int l = 0; l < L; ++l) {
      LayerWeights lw{view(nD, {D}), view(nD, {D}), view(wq, {Hq * d, D}), view(wk, {Hkv * d, D}),
                      view(wv, {Hkv * d, D}), view(wo, {D, Hq * d}), view(nd, {d}), view(nd, {d}),
                      view(wg, {I, D}), view(wu, {I, D}), view(wd, {D, I})};
      w.layers.push_back(lw);
    }
    w.final_norm = view(nD, {D});

    BackendOptions opts;
    opts.threads = threads;
    opts.weights = weights;
    opts.profile = profile;  // the table goes to stderr after every step
    auto be = make_backend(backend, opts);
    auto t0 = std::chrono::steady_clock::now();
    be->load(cfg, w);
    const double load_s = seconds_since(t0);

    // Cache: valid rows random, the rest zero (never read).
    KVCache kv;
    kv.B = B; kv.Hkv = Hkv; kv.P = Smax; kv.d = d;
    kv.valid_len.assign(B, S);
    std::vector<std::vector<uint16_t>> store;
    for (int l = 0; l < L; ++l)
      for (int which = 0; which < 2; ++which) {
        auto& c = store.emplace_back(size_t(B) * Hkv * Smax * d, 0);
        for (size_t bh = 0; bh < size_t(B) * Hkv; ++bh)
          for (size_t i = 0; i < size_t(S) * d; ++i) c[bh * Smax * d + i] = f32_to_bf16(rng.normal());
        (which ? kv.value : kv.key).push_back(TensorView{DType::BF16, {B, Hkv, Smax, d}, c.data(), "cache"});
      }
    RopeTables rope;
    rope.B = B; rope.T = T; rope.d = d;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) {
          const double a = (S + t) * std::pow(5e6, -2.0 * (i % (d / 2)) / d);
          rope.cos.push_back(float(std::cos(a)));
          rope.sin.push_back(float(std::sin(a)));
        }
    t0 = std::chrono::steady_clock::now();
    be->bind(kv, rope);
    const double bind_s = seconds_since(t0);

    std::vector<float> emb(size_t(B) * T * D), out(emb.size());
    for (auto& x : emb) x = rng.normal();
    for (int i = 0; i < warmup; ++i) be->step(emb.data(), out.data());
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) {
      t0 = std::chrono::steady_clock::now();
      be->step(emb.data(), out.data());
      times.push_back(seconds_since(t0));
    }
    double mean = 0, best = 1e30;
    for (double t : times) { mean += t; best = std::min(best, t); }
    mean /= times.size();
    std::printf("backend %s, weights %s, threads %d: L=%d D=%d Hq=%d Hkv=%d d=%d I=%d T=%d S=%d Smax=%d B=%d\n",
                backend.c_str(), weights.c_str(), threads, L, D, Hq, Hkv, d, I, T, S, Smax, B);
    std::printf("load %.2f s, bind %.3f s\n", load_s, bind_s);
    std::printf("step: mean %.4f s, min %.4f s over %d steps; 10-step sample ~ %.2f s\n", mean, best, steps,
                10 * mean);
    std::printf("peak memory (VmHWM): %.1f MiB\n", vm_hwm_kb() / 1024.0);
    std::printf("{\"backend\":\"%s\",\"weights\":\"%s\",\"threads\":%d,\"S\":%d,\"step_s_mean\":%.5f,"
                "\"step_s_min\":%.5f,\"vmhwm_mib\":%.1f}\n",
                backend.c_str(), weights.c_str(), threads, S, mean, best, vm_hwm_kb() / 1024.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
