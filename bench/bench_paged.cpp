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
#include "synthetic_expert.h"

namespace {

using namespace alpamayo;

long vm_rss_kb() { return bench::proc_status_kb("VmRSS:"); }

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
    bench::Rng rng{0x9E3779B97F4A7C15ull};
    const bench::SyntheticExpert synth(L, D, Hq, Hkv, d, I, T, rng);
    const ExpertConfig& cfg = synth.cfg;
    const ModelWeights& w = synth.weights;
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
      dense[i] = bench::random_bf16(size_t(Hkv) * S * d, 1.f, rng);
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
