// A paged cache against the dense binding of the same rows on the full-size expert (random weights), in one run:
// 1 sample, and 6 samples of one prompt (n > 1 sampling: their block tables share the prompt's pages). For each
// binding: the time per step, the session's buffers and the resident memory the bind and a step add, and whether
// the result is bitwise the dense one. Pages are page_size rows in a shuffled pool [num_pages, page_size, Hkv, d]
// (NHD, or HND with --layout; K and V in separate pools, one pool per layer), as vLLM and FlashInfer hold them.
//   build/bench/bench_paged [--S 4700] [--page 16] [--layout NHD|HND] [--threads 2] [--steps 2] [--kv bf16|int8]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/environment.h"

namespace {

using namespace alpamayo;

long vm_rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

struct Rng {
  uint64_t s;
  float normal() {  // roughly N(0, 1), fast enough for gigabytes
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

struct Timed {
  std::vector<float> action;
  double best = 1e30, mean = 0;
  size_t buffers = 0;
  long bind_kb = 0, step_kb = 0;  // resident memory added by the bind, then by the first sample
};

Timed run(const std::shared_ptr<const Model>& m, const Context& c, int steps) {
  Timed t;
  Session s(m);
  const long r0 = vm_rss_kb();
  s.bind(c);
  const long r1 = vm_rss_kb();
  SampleOptions so;
  so.seed = 7;
  so.steps = 1;
  s.sample(so);  // warm-up: touches every buffer
  t.bind_kb = r1 - r0;
  t.step_kb = vm_rss_kb() - r1;
  so.steps = steps;
  const SampleResult r = s.sample(so);
  for (double x : r.step_seconds) t.best = std::min(t.best, x), t.mean += x / r.step_seconds.size();
  t.action = r.action;
  t.buffers = s.buffer_bytes();
  return t;
}

bool all_bitwise = true;  // the exit status: 1 where a paged binding's result differs from the dense one

void report(const char* what, const Timed& t, const Timed* dense) {
  if (dense && t.action != dense->action) all_bitwise = false;
  std::printf("%-44s step mean %.3f s, min %.3f s; session buffers %.1f MiB; RSS +%.1f MiB at bind, +%.1f MiB in "
              "the first step%s\n",
              what, t.mean, t.best, t.buffers / 1048576.0, t.bind_kb / 1024.0, t.step_kb / 1024.0,
              dense ? (t.action == dense->action ? "; bitwise the dense binding" : "; DIFFERS from the dense binding")
                    : "");
}

}  // namespace

int main(int argc, char** argv) {
  int L = 64, D = 1536, Hq = 16, Hkv = 8, d = 128, I = 6144, T = 64, S = 4700, page = 16, threads = 2, steps = 2,
      samples = 6, rounds = 2;
  std::string kv_format, layout = "NHD";
  CLI::App app{"Paged against dense cache bindings on the full-size expert"};
  app.add_option("--L", L, "layers");
  app.add_option("--S", S, "prompt rows");
  app.add_option("--page", page, "page size (rows)");
  app.add_option("--samples", samples, "samples of one prompt in the shared case");
  app.add_option("--threads", threads, "threads (0: all cores)");
  app.add_option("--steps", steps, "timed Euler steps per binding and round");
  app.add_option("--rounds", rounds, "rounds of the bindings in turn (a slow spell of the host hits both alike)");
  app.add_option("--kv", kv_format, "KV cache format (bf16 | int8)");
  app.add_option("--layout", layout, "page layout: NHD [num_pages, page, Hkv, d] or HND [num_pages, Hkv, page, d]");
  CLI11_PARSE(app, argc, argv);
  try {
    Rng rng{0x9E3779B97F4A7C15ull};
    ExpertConfig cfg;
    cfg.L = L; cfg.D = D; cfg.Hq = Hq; cfg.Hkv = Hkv; cfg.d = d; cfg.I = I; cfg.T = T;
    cfg.ain_layers = 1; cfg.ain_hidden = 256;
    auto mat = [&](int out, int in) { return random_bf16(size_t(out) * in, 1.f / std::sqrt(float(in)), rng); };
    auto ones = [&](int n) { return std::vector<uint16_t>(n, f32_to_bf16(1.f)); };
    const auto wq = mat(Hq * d, D), wk = mat(Hkv * d, D), wv = mat(Hkv * d, D), wo = mat(D, Hq * d),
               wg = mat(I, D), wu = mat(I, D), wd = mat(D, I), nD = ones(D), nd = ones(d);
    const int F = cfg.n_fourier, h = cfg.ain_hidden;
    const auto a0 = mat(h, (cfg.A + 1) * F), a1 = mat(D, h), b0 = ones(h), b1 = ones(D), nh = ones(h),
               ao = mat(cfg.A, D), bo = ones(cfg.A);
    auto view = [](const std::vector<uint16_t>& v, std::vector<int64_t> shape) {
      return TensorView{DType::BF16, std::move(shape), v.data(), "bench"};
    };
    ModelWeights w;
    for (int l = 0; l < L; ++l)
      w.expert.layers.push_back({view(nD, {D}), view(nD, {D}), view(wq, {Hq * d, D}), view(wk, {Hkv * d, D}),
                                 view(wv, {Hkv * d, D}), view(wo, {D, Hq * d}), view(nd, {d}), view(nd, {d}),
                                 view(wg, {I, D}), view(wu, {I, D}), view(wd, {D, I})});
    w.expert.final_norm = view(nD, {D});
    w.action_in.linear_w = {view(a0, {h, (cfg.A + 1) * F}), view(a1, {D, h})};
    w.action_in.linear_b = {view(b0, {h}), view(b1, {D})};
    w.action_in.norm_w = {view(nh, {h})};
    w.action_in.ln_w = view(b1, {D});
    w.action_in.ln_b = view(b1, {D});
    w.action_out = {view(ao, {cfg.A, D}), view(bo, {cfg.A})};
    BackendOptions opts;
    opts.threads = threads;
    opts.kv = kv_format;
    options_from_environment(opts, "cpu");
    const auto model = Model::from_weights(cfg, w, nullptr, "cpu", opts);

    // The prompt's rows [L][2][Hkv][S][d], then the same rows in a shuffled page pool per layer and K / V.
    const int64_t pages = (S + page - 1) / page, rowlen = int64_t(Hkv) * d;
    std::vector<std::vector<uint16_t>> dense(size_t(2 * L)), pool(size_t(2 * L));
    std::vector<int64_t> perm(pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    for (size_t i = 0; i < dense.size(); ++i) {
      dense[i] = random_bf16(size_t(Hkv) * S * d, 1.f, rng);
      pool[i].assign(size_t(pages) * page * rowlen, 0);
      for (int hh = 0; hh < Hkv; ++hh)
        for (int64_t r = 0; r < S; ++r)
          std::copy_n(dense[i].data() + (size_t(hh) * S + r) * d, d,
                      pool[i].data() + size_t(perm[r / page]) * page * rowlen +
                          (layout == "HND" ? (size_t(hh) * page + r % page) * d : size_t(r % page) * rowlen + hh * d));
    }
    auto paged = [&](int B) {
      std::vector<TensorView> k, v;
      for (int l = 0; l < L; ++l) {
        const std::vector<int64_t> shape = layout == "HND" ? std::vector<int64_t>{pages, Hkv, page, d}
                                                            : std::vector<int64_t>{pages, page, Hkv, d};
        k.push_back({DType::BF16, shape, pool[2 * l].data(), "key_pages"});
        v.push_back({DType::BF16, shape, pool[2 * l + 1].data(), "value_pages"});
      }
      static std::vector<int64_t> table;
      table.clear();
      for (int b = 0; b < B; ++b) table.insert(table.end(), perm.begin(), perm.end());
      const TensorView bt{DType::I64, {B, pages}, table.data(), "block_table"};
      return Context::from_paged(k, v, bt, std::vector<int64_t>(B, S), std::vector<int64_t>(B, 0), layout,
                                 std::nullopt, std::vector<float>(B, 8.f), "paged");
    };
    // Dense: prompt rows [0, prompt) stored once; with `suffix` > 0 each sample's rows [prompt, S) as its suffix.
    std::deque<std::vector<uint16_t>> sfx_store;  // every dense context's suffix rows, alive to the end
    auto dense_ctx = [&](int B, int64_t prompt) {
      KVCache kv;
      kv.B = B, kv.G = 1, kv.Hkv = Hkv, kv.d = d, kv.P = S;
      kv.valid_len = {prompt};
      if (B > 1) kv.prompt_of.assign(B, 0);
      const int64_t q = S - prompt;
      if (q > 0) kv.Q = static_cast<int>(q), kv.suffix_len.assign(B, q);
      for (int l = 0; l < L; ++l)
        for (int which = 0; which < 2; ++which) {
          const auto& src = dense[2 * l + which];
          (which ? kv.value : kv.key).push_back({DType::BF16, {1, Hkv, S, d}, src.data(), "cache"});
          if (q == 0) continue;
          auto& s = sfx_store.emplace_back(size_t(B) * Hkv * q * d);
          for (int b = 0; b < B; ++b)
            for (int hh = 0; hh < Hkv; ++hh)
              std::copy_n(src.data() + (size_t(hh) * S + prompt) * d, q * d, s.data() + (size_t(b * Hkv + hh) * q) * d);
          (which ? kv.suffix_value : kv.suffix_key).push_back({DType::BF16, {B, Hkv, q, d}, s.data(), "suffix"});
        }
      return Context::from_views(kv, std::vector<int64_t>(B, 0), std::nullopt, std::vector<float>(B, 8.f), "dense");
    };
    std::printf("cpu backend, kv %s, %d threads: L=%d Hkv=%d d=%d T=%d, prompt %d rows, pages of %d rows (%s)\n",
                model->kv().c_str(), threads, L, Hkv, d, T, S, page, layout.c_str());
    // The bindings of one case run in turn, `rounds` times: each keeps its best step and its mean over the rounds.
    auto compare = [&](std::vector<std::pair<std::string, Context>> cases) {
      std::vector<Timed> best(cases.size());
      for (int round = 0; round < rounds; ++round)
        for (size_t c = 0; c < cases.size(); ++c) {
          Timed t = run(model, cases[c].second, steps);
          Timed& b = best[c];
          if (round == 0) b = t, b.mean = 0;
          b.best = std::min(b.best, t.best);
          b.mean += t.mean / rounds;
          if (t.action != b.action) b.action.clear();  // not even deterministic: never bitwise anything
        }
      for (size_t c = 0; c < cases.size(); ++c) report(cases[c].first.c_str(), best[c], c == 1 ? &best[0] : nullptr);
    };
    compare({{"1 sample, dense [1, Hkv, S, d]:", dense_ctx(1, S)}, {"1 sample, paged:", paged(1)}});
    // Shared: the full pages are the shared prompt, the last partial page each sample's own (as from_paged finds).
    const std::string n = std::to_string(samples);
    compare({{n + " samples, dense shared prompt + suffixes:", dense_ctx(samples, S / page * page)},
             {n + " samples, paged (shared pages found):", paged(samples)},
             {n + " samples, dense one shared prompt:", dense_ctx(samples, S)}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_paged: %s\n", e.what());
    return 1;
  }
  return all_bitwise ? 0 : 1;
}
