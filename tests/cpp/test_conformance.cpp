// The conformance suite: every registered backend, every weight format it offers, a table of shapes,
// against the reference backend through the public Model / Session API. A backend registered in
// src/backends/registry.cpp is tested here without further work.
//
// Compared per shape: step 0's action_in_proj output, every layer's output and the final hidden state of a
// captured step, every velocity v_k, the final action x_N and the decoded trajectory (metres), under the
// tolerances of the weight format (tolerance() below, with the measurements behind them). Also: bitwise
// determinism (same inputs twice, rebinding, two sessions at once on one model), thread counts, and the
// errors of the seam (sample before bind, contexts that do not fit, memory a backend cannot read).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/error.h"
#include "model/fourier.h"
#include "model/sampler.h"
#include "conformance_util.h"
#include "test_util.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_backend_impl.h"
#endif

namespace alpamayo {
namespace {

using namespace conformance;

struct Target {
  std::string backend, format;
};
std::vector<Target> targets() {
  std::vector<Target> t;
  for (const BackendInfo& b : registered_backends())
    for (const std::string& f : b.weight_formats) t.push_back({b.name, f});
  return t;
}

// A backend that cannot run on this machine (a GPU backend without a GPU) is reported as skipped, never
// as passed. Returns the reason, empty when the target runs.
std::string unavailable(const Target& t) { return find_backend(t.backend).unavailable(); }
#define SKIP_IF_UNAVAILABLE(t)                                                  \
  if (const std::string why = unavailable(t); !why.empty()) GTEST_SKIP() << (t).backend << ": " << why

// The oracle of a format: the reference backend with the same weight format where it offers it (the same
// rounded weights, so only the kernels differ), else the exact fp32 reference.
std::string oracle_format(const std::string& format) {
  for (const std::string& f : find_backend("reference").weight_formats)
    if (f == format) return f;
  return "f32";
}
std::string target_name(const Target& t) { return t.backend + "_" + t.format; }

class Conformance : public ::testing::TestWithParam<std::tuple<Target, int>> {};

TEST_P(Conformance, MatchesTheReference) {
  const auto& [tg, si] = GetParam();
  const Shape& sh = shapes()[si];
  Problem p(sh);
  const Tolerance tol = tolerance(tg.format);
  const int cap_step = 0;  // same input x_0 on both sides: the layers are compared without the sampler's gain
  SKIP_IF_UNAVAILABLE(tg);
  const RunOut ref = run(p.model("reference", oracle_format(tg.format)), p.context(), cap_step);
  const RunOut got = run(p.model(tg.backend, tg.format), p.context(), cap_step);
  const std::string at = tg.backend + "/" + tg.format + " " + sh.name;

  ASSERT_EQ(got.cap.step, cap_step) << at;
  ASSERT_EQ(got.cap.layers.size(), size_t(sh.L)) << at;
  expect_layer_close(compare(got.cap.emb, ref.cap.emb), tol, at + " action_in_proj output at step " + std::to_string(cap_step));
  for (int l = 0; l < sh.L; ++l)
    expect_layer_close(compare(got.cap.layers[l], ref.cap.layers[l]), tol, at + " layer " + std::to_string(l));
  expect_layer_close(compare(got.cap.hidden, ref.cap.hidden), tol, at + " final hidden");

  const size_t n = size_t(sh.S.size()) * sh.T * 2;
  ASSERT_EQ(got.r.v_steps.size(), n * sh.steps) << at;
  for (int k = 0; k < sh.steps; ++k)
    expect_sampler_close(compare(got.r.v_steps.data() + k * n, ref.r.v_steps.data() + k * n, n), tol,
                         at + " v_" + std::to_string(k));
  expect_sampler_close(compare(got.r.action, ref.r.action), tol, at + " action x_N");
  double dev = 0, extent = 0;
  for (size_t i = 0; i < got.r.xyz.size(); ++i) {
    dev = std::max(dev, double(std::fabs(got.r.xyz[i] - ref.r.xyz[i])));
    extent = std::max(extent, double(std::fabs(ref.r.xyz[i])));
  }
  if (std::getenv("ALPAMAYO_CONFORMANCE_REPORT"))
    std::printf("  %-60s %.2e m of %.1f m\n", (at + " trajectory").c_str(), dev, extent);
  EXPECT_LE(dev, tol.traj_rel * extent) << at << " trajectory deviation in metres, of " << extent << " m";
  EXPECT_EQ(got.r.v0, ref.r.v0) << at;
}

TEST_P(Conformance, DeterministicAcrossRunsRebindsAndSessions) {
  const auto& [tg, si] = GetParam();
  const Shape& sh = shapes()[si];
  SKIP_IF_UNAVAILABLE(tg);
  Problem p(sh);
  auto m = p.model(tg.backend, tg.format);
  const std::string at = tg.backend + "/" + tg.format + " " + sh.name;

  Session s(m);
  s.bind(p.context());
  const SampleResult a = s.sample({.seed = 5});
  EXPECT_EQ(s.sample({.seed = 5}).action, a.action) << at << ": same inputs twice";
  EXPECT_NE(s.sample({.seed = 6}).action, a.action) << at << ": the seed must matter";

  // Rebind to other sizes (one more sample, more rows), then back.
  std::vector<int64_t> S2 = sh.S, rd2 = sh.rope_delta;
  S2.push_back(sh.P + 3);
  rd2.push_back(-1);
  s.bind(p.context(sh.P + 5, S2, rd2));
  const SampleResult b = s.sample({.seed = 5});
  EXPECT_EQ(b.B, a.B + 1);
  s.bind(p.context());
  EXPECT_EQ(s.sample({.seed = 5}).action, a.action) << at << ": after rebinding";
  Session fresh(m);
  fresh.bind(p.context(sh.P + 5, S2, rd2));
  EXPECT_EQ(fresh.sample({.seed = 5}).action, b.action) << at << ": a fresh session on the rebound sizes";

  // Two sessions of one model at once (different contexts and seeds): each gives its solo result.
  Session s1(m), s2(m);
  s1.bind(p.context());
  s2.bind(p.context(sh.P + 5, S2, rd2));
  SampleResult r1, r2;
  std::thread t([&] { r2 = s2.sample({.seed = 5}); });
  r1 = s1.sample({.seed = 5});
  t.join();
  EXPECT_EQ(r1.action, a.action) << at << ": concurrent session 1";
  EXPECT_EQ(r2.action, b.action) << at << ": concurrent session 2";
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Combine(::testing::ValuesIn(targets()),
                                            ::testing::Range(0, static_cast<int>(shapes().size()))),
                         [](const auto& info) {
                           return target_name(std::get<0>(info.param)) + "_" + shapes()[std::get<1>(info.param)].name;
                         });

class SeamErrors : public ::testing::TestWithParam<Target> {};

TEST_P(SeamErrors, InputsAreValidatedBeforeTheBackend) {
  const Target tg = GetParam();
  SKIP_IF_UNAVAILABLE(tg);
  Problem p(shapes()[1]);
  auto m = p.model(tg.backend, tg.format);
  Session s(m);
  test::expect_error([&] { s.sample({}); }, {"no context bound"});

  // A context of another layer count.
  Shape other = shapes()[1];
  other.L = 3;
  Problem q(other);
  test::expect_error([&] { s.bind(q.context()); }, {"3 cache layers", "2 layers"});
  EXPECT_FALSE(s.bound());

  // Memory the backend cannot read: a cache said to live on a GPU.
  Context ok = p.context();
  KVCache kv = ok.kv();
  kv.key[1].device = {DeviceType::CUDA, 0};
  Context on_gpu = Context::from_views(kv, ok.rope_delta(), std::nullopt, std::vector<float>(kv.B, 1.f), "gpu ctx");
  test::expect_error([&] { s.bind(on_gpu); }, {"key.1", "cuda:0", tg.backend});

  // Steps and captures out of range, noise of the wrong size.
  test::expect_error([&] { s.bind(p.context(), {.capture = {.step = -2}}); }, {"capture step"});
  s.bind(p.context());
  test::expect_error([&] { s.sample({.steps = -1}); }, {"steps"});
  test::expect_error([&] { s.sample({.steps = 100001}); }, {"steps"});
  test::expect_error([&] { s.sample({.noise = std::vector<float>(3, 0.f)}); }, {"noise", "found 3"});
  // A capture step beyond the sample's steps captures nothing.
  s.bind(p.context(), {.capture = {.step = 50}});
  s.sample({.steps = 2});
  EXPECT_EQ(s.captures().step, -1);
}

TEST_P(SeamErrors, ModelLoadingChecksFormatsAndWeights) {
  const Target tg = GetParam();
  SKIP_IF_UNAVAILABLE(tg);
  Problem p(shapes()[0]);
  test::expect_error([&] { p.model(tg.backend, "fp64"); }, {"unknown weight format 'fp64'", tg.format});
  Problem bad(shapes()[0]);
  bad.w.expert.layers[1].down.shape = {5, 5};
  test::expect_error([&] { bad.model(tg.backend, tg.format); }, {"expected shape", "[5, 5]"});
  Problem nc(shapes()[0]);
  nc.w.expert.layers[0].q.strides = {1, 32};  // column-major
  test::expect_error([&] { nc.model(tg.backend, tg.format); }, {"contiguous"});
}

INSTANTIATE_TEST_SUITE_P(Backends, SeamErrors, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return target_name(info.param); });

TEST(Conformance, ReferenceIsIndependentOfThreadCount) {
  Problem p(shapes()[2]);
  const SampleResult one = run(p.model("reference", "f32", 1), p.context(), -1).r;
  for (int t : {2, 3}) EXPECT_EQ(run(p.model("reference", "f32", t), p.context(), -1).r.action, one.action) << t;
}

// Host backends other than the reference split attention and matmuls by thread count today, which
// changes rounding only: the results stay within the format's tolerance of the one-thread run.
TEST(Conformance, ThreadCountsStayWithinTolerance) {
  for (const Target& tg : targets()) {
    if (tg.backend == "reference" || !unavailable(tg).empty()) continue;
    Problem p(shapes()[2]);
    const SampleResult one = run(p.model(tg.backend, tg.format, 1), p.context(), -1).r;
    for (int t : {2, 3}) {
      const SampleResult r = run(p.model(tg.backend, tg.format, t), p.context(), -1).r;
      expect_sampler_close(compare(r.action, one.action), tolerance(tg.format),
                           target_name(tg) + " threads " + std::to_string(t));
    }
  }
}

TEST(Conformance, EveryBackendIsTested) {
  // The registry lists the reference first-class too; a build always has it.
  bool has_ref = false;
  for (const Target& t : targets()) has_ref |= t.backend == "reference";
  EXPECT_TRUE(has_ref);
  EXPECT_EQ(find_backend(backend_names().front()).name, backend_names().front());
  test::expect_error([] { find_backend("tpu"); }, {"unknown backend 'tpu'", "reference"});
}

#ifdef ALPAMAYO_WITH_CPU_BACKEND
// The cpu backend's attention without AVX512-BF16 (forced here), on the shapes with one and several key
// chunks per sample.
TEST(Conformance, CpuPortableAttentionMatchesTheReference) {
  for (int si : {1, 2}) {
    const Shape& sh = shapes()[si];
    Problem p(sh);
    BackendOptions o;
    o.threads = 2;
    o.weights = "bf16";
    auto bm = load_cpu_backend(p.cfg, p.w, o);
    auto sess = bm->new_session();
    static_cast<cpu::CpuSession*>(sess.get())->set_portable_attention(true);
    Context ctx = p.context();
    Binding b;
    b.kv = ctx.kv();
    b.rope = make_rope_tables(b.kv.valid_len, ctx.rope_delta(), p.cfg.T, p.cfg.d, p.cfg.rope_theta);
    b.capture = {.step = 0, .layers = true};
    sess->bind(b);
    std::vector<float> x = gaussian_noise(11, int64_t(b.kv.B) * p.cfg.T * p.cfg.A);
    const std::vector<float> times = euler_time_grid(sh.steps);
    sess->denoise({.x = x.data(), .times = times.data(), .steps = sh.steps});
    const RunOut ref = run(p.model("reference", "f32"), p.context(), 0);
    for (int l = 0; l < sh.L; ++l)
      expect_layer_close(compare(sess->captures().layers[l], ref.cap.layers[l]), tolerance("bf16"),
                         sh.name + " portable attention layer " + std::to_string(l));
    expect_sampler_close(compare(x, ref.r.action), tolerance("bf16"), sh.name + " portable attention x_N");
  }
}
#endif

}  // namespace
}  // namespace alpamayo
