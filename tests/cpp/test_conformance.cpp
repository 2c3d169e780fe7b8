// The conformance suite: every registered backend, every weight format it offers, a table of shapes,
// against the reference backend through the public Model / Session API. A backend registered in
// src/backends/registry.cpp is tested here without further work.
//
// Compared per shape: step 0's action_in_proj output, every layer's output and the final hidden state of a
// captured step, every velocity v_k, the final action x_N and the decoded trajectory (metres), under the
// bounds of the error model (error_model.h, docs/ACCURACY.md), each v_k teacher-forced. Also: bitwise
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
#include "backends/cpu/profile/profile_table.h"
#include "backends/cpu/runtime/isa.h"
#endif

namespace alpamayo {
namespace {

using namespace conformance;

// One target (a backend, a weight format, optionally a KV cache format and forced kernels) on shape si against its
// oracle. Returns the run (for further checks); *model_kernels, if given, gets the kernels the model loaded.
RunOut expect_target_matches(const std::string& backend, const std::string& format, const std::string& kv,
                             const std::string& kernels, int si, const std::string& at,
                             std::string* model_kernels = nullptr) {
  const Shape& sh = shapes()[si];
  Problem p(sh);
  const auto oracle = p.model("reference", oracle_format(format), 2, {}, kv);
  const RunOut ref = run(oracle, p.context(), 0);
  const auto m = p.model(backend, format, 2, {}, kv, kernels);
  if (model_kernels) *model_kernels = m->kernels();
  const RunOut got = run(m, p.context(), 0);
  expect_run_close(got, ref, *oracle, p.context(), target_error_model(p, backend, format, kv), sh, at);
  return got;
}

class Conformance : public ::testing::TestWithParam<std::tuple<Target, int>> {};

TEST_P(Conformance, MatchesTheReference) {
  const auto& [tg, si] = GetParam();
  SKIP_IF_UNAVAILABLE(tg);
  SKIP_UNLESS_DECLARED(tg.backend, shapes()[si]);
  expect_target_matches(tg.backend, tg.format, "", "", si, tg.backend + "/" + tg.format + " " + shapes()[si].name);
}

// Bitwise determinism of model m (built from p): same inputs twice, rebinding, two sessions at once.
void expect_deterministic(Problem& p, const Shape& sh, const std::shared_ptr<const Model>& m, const std::string& at) {
  Session s(m);
  s.bind(p.context());
  const SampleResult a = s.sample({.seed = 5});
  EXPECT_EQ(s.sample({.seed = 5}).action, a.action) << at << ": same inputs twice";
  EXPECT_NE(s.sample({.seed = 6}).action, a.action) << at << ": the seed must matter";

  // Rebind to other sizes (one more sample, more rows), then back.
  CtxSpec other = sh.ctx;
  other.P += 5;
  const int g_new = static_cast<int>(other.S.size());
  other.S.push_back(other.P - 2);
  other.rope_delta.push_back(-1);
  if (!other.prompt_of.empty()) other.prompt_of.push_back(g_new);
  if (!other.pad.empty()) other.pad.push_back(1);
  if (other.Q > 0) other.suffix.push_back(other.Q);
  s.bind(p.context(other));
  const SampleResult b = s.sample({.seed = 5});
  EXPECT_EQ(b.B, a.B + 1);
  s.bind(p.context());
  EXPECT_EQ(s.sample({.seed = 5}).action, a.action) << at << ": after rebinding";
  Session fresh(m);
  fresh.bind(p.context(other));
  EXPECT_EQ(fresh.sample({.seed = 5}).action, b.action) << at << ": a fresh session on the rebound sizes";

  // Two sessions of one model at once (different contexts and seeds): each gives its solo result.
  Session s1(m), s2(m);
  s1.bind(p.context());
  s2.bind(p.context(other));
  SampleResult r1, r2;
  std::thread t([&] { r2 = s2.sample({.seed = 5}); });
  r1 = s1.sample({.seed = 5});
  t.join();
  EXPECT_EQ(r1.action, a.action) << at << ": concurrent session 1";
  EXPECT_EQ(r2.action, b.action) << at << ": concurrent session 2";
}

TEST_P(Conformance, DeterministicAcrossRunsRebindsAndSessions) {
  const auto& [tg, si] = GetParam();
  const Shape& sh = shapes()[si];
  SKIP_IF_UNAVAILABLE(tg);
  SKIP_UNLESS_DECLARED(tg.backend, sh);
  Problem p(sh);
  expect_deterministic(p, sh, p.model(tg.backend, tg.format), tg.backend + "/" + tg.format + " " + sh.name);
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Combine(::testing::ValuesIn(targets()),
                                            ::testing::Range(0, static_cast<int>(shapes().size()))),
                         [](const auto& info) {
                           return target_name(std::get<0>(info.param)) + "_" + shapes()[std::get<1>(info.param)].name;
                         });

// The KV cache formats other than a backend's default (kv_targets(): "int8"), on every shape: the backend with its
// default weight format and that KV cache format against the reference with the same KV cache format, under the
// error model with the kernel's own roundings of that format (target_error_model); bitwise determinism as above. A backend that silently ignored the option would match within the
// bounds too, so the result must also differ from the same backend with its default KV cache format.
class ConformanceKv : public ::testing::TestWithParam<std::tuple<KvTarget, int>> {};

TEST_P(ConformanceKv, MatchesTheReference) {
  const auto& [tg, si] = GetParam();
  const Shape& sh = shapes()[si];
  SKIP_IF_UNAVAILABLE(tg);
  SKIP_UNLESS_DECLARED(tg.backend, sh);
  Problem p(sh);
  const int cap_step = 0;
  const std::string at = tg.backend + "/" + tg.format + " kv " + tg.kv + " " + sh.name;
  const RunOut got = expect_target_matches(tg.backend, tg.format, tg.kv, "", si, at);
  EXPECT_EQ(p.model(tg.backend, tg.format, 2, {}, tg.kv)->kv(), tg.kv) << at;
  EXPECT_NE(run(p.model(tg.backend, tg.format), p.context(), cap_step).r.action, got.r.action)
      << at << ": the KV cache format must matter";
}

TEST_P(ConformanceKv, DeterministicAcrossRunsRebindsAndSessions) {
  const auto& [tg, si] = GetParam();
  const Shape& sh = shapes()[si];
  SKIP_IF_UNAVAILABLE(tg);
  SKIP_UNLESS_DECLARED(tg.backend, sh);
  Problem p(sh);
  expect_deterministic(p, sh, p.model(tg.backend, tg.format, 2, {}, tg.kv),
                       tg.backend + "/" + tg.format + " kv " + tg.kv + " " + sh.name);
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceKv,
                         ::testing::Combine(::testing::ValuesIn(kv_targets()),
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

  // Memory the backend cannot read: a cache said to live on a GPU. A backend that reads GPU memory checks the
  // address itself and finds host memory there.
  Context ok = p.context();
  KVCache kv = ok.kv();
  kv.key[1].device = {DeviceType::CUDA, 0};
  Context on_gpu = Context::from_views(kv, ok.rope_delta(), std::nullopt, std::vector<float>(kv.B, 1.f), "gpu ctx");
  const bool reads_gpu = m->backend().can_read(kv.key[1].device);
  test::expect_error([&] { s.bind(on_gpu); }, {"key.1", "cuda:0", reads_gpu ? "host memory" : tg.backend});

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
  const std::vector<std::string>& kvs = find_backend(tg.backend).kv_formats;
  test::expect_error([&] { p.model(tg.backend, tg.format, 2, {}, "fp16"); },
                     {"backend " + tg.backend, "unknown KV cache format 'fp16'", "it offers " + kvs.front()});
  EXPECT_EQ(p.model(tg.backend, tg.format)->kv(), kvs.front());
  Problem bad(shapes()[0]);
  bad.w.expert.layers[1].down.shape = {5, 5};
  test::expect_error([&] { bad.model(tg.backend, tg.format); }, {"expected shape", "[5, 5]"});
  Problem nc(shapes()[0]);
  nc.w.expert.layers[0].q.strides = {1, 32};  // column-major
  test::expect_error([&] { nc.model(tg.backend, tg.format); }, {"contiguous"});
}

INSTANTIATE_TEST_SUITE_P(Backends, SeamErrors, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return target_name(info.param); });

// The unguided context of the shared-prompt shape (shapes()[5]): its prompts without the navigation text, i.e.
// other lengths, padding and rope deltas, the same samples.
CtxSpec unguided_of_shared_shape() {
  CtxSpec u = shapes()[5].ctx;
  u.P = 24;
  u.S = {20, 24};
  u.pad = {0, 2};
  u.rope_delta = {-3, -3, 1, -3};
  return u;
}

// Classifier-free guidance (Alpamayo 1.5): v = (1 - w) v_unguided + w v_guided at every step, against the
// reference; w = 1 and w = 0 reproduce the guided and the unguided context alone, bit for bit.
class GuidanceConformance : public ::testing::TestWithParam<Target> {};

TEST_P(GuidanceConformance, MatchesTheReferenceAndIsExactAtTheEnds) {
  const Target tg = GetParam();
  SKIP_IF_UNAVAILABLE(tg);
  const Shape& sh = shapes()[5];
  SKIP_UNLESS_DECLARED(tg.backend, sh, true);
  Problem p(sh);
  const CtxSpec u = unguided_of_shared_shape();
  const std::string at = target_name(tg) + " guidance";
  auto run_guided = [&](const std::shared_ptr<const Model>& m, double w) {
    Session s(m);
    s.bind(p.context(), {.guidance = Guidance{p.context(u), w}});
    return s.sample({.seed = 3, .all_steps = true});
  };
  auto run_plain = [&](const std::shared_ptr<const Model>& m, const Context& c) {
    Session s(m);
    s.bind(c);
    return s.sample({.seed = 3, .all_steps = true});
  };
  auto m = p.model(tg.backend, tg.format);
  const double w = 1.7;
  const SampleResult got = run_guided(m, w);
  const auto oracle = p.model("reference", oracle_format(tg.format));
  const SampleResult ref = run_guided(oracle, w);
  // Teacher-forced: the guided oracle, and each context alone for the sizes, at got's own x_k. Each pass errs by
  // rho(L + 2) of its own velocity, so v = (1 - w) v_u + w v_g by |1 - w| rho rms(v_u) + |w| rho rms(v_g).
  const Context guided = p.context(), unguided = p.context(u);
  const std::vector<float> vt = teacher_forced_v(*oracle, guided, got.x_steps, sh.steps, &unguided, w);
  const std::vector<float> vg = teacher_forced_v(*oracle, guided, got.x_steps, sh.steps);
  const std::vector<float> vu = teacher_forced_v(*oracle, unguided, got.x_steps, sh.steps);
  const ErrorModel em = target_error_model(p, tg.backend, tg.format);
  const double rho = em.rho(depth_v(sh.L));
  const size_t n = size_t(p.batch()) * sh.T * 2;
  for (int k = 0; k < sh.steps; ++k) {
    const double budget = rho * (std::fabs(1 - w) * rms(vu.data() + k * n, n) + std::fabs(w) * rms(vg.data() + k * n, n));
    expect_within_rms(compare(got.v_steps.data() + k * n, vt.data() + k * n, n), budget,
                      at + " v_" + std::to_string(k) + " (teacher-forced)");
  }
  expect_sampler_consistent(got, p.cfg, at);
  report_free_running(got, ref, at);
  EXPECT_NE(got.action, run_plain(m, p.context()).action) << at << ": the weight must matter";
  EXPECT_EQ(run_guided(m, 1.0).action, run_plain(m, p.context()).action) << at << ": w = 1";
  EXPECT_EQ(run_guided(m, 0.0).action, run_plain(m, p.context(u)).action) << at << ": w = 0";

  Session s(m);
  CtxSpec fewer = u;
  fewer.rope_delta.pop_back();
  fewer.prompt_of.pop_back();
  fewer.suffix.pop_back();
  test::expect_error([&] { s.bind(p.context(), {.guidance = Guidance{p.context(fewer), 1.5}}); },
                     {"guidance context has 3 samples", "has 4"});
  test::expect_error([&] { s.bind(p.context(), {.guidance = Guidance{p.context(u), NAN}}); }, {"guidance weight"});
  EXPECT_FALSE(s.bound());
}

INSTANTIATE_TEST_SUITE_P(Backends, GuidanceConformance, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return target_name(info.param); });

// Initial noise: per-sample seeds make sample b reproducible alone; the temperature scales it in fp32.
TEST(Conformance, PerSampleSeedsAndTemperature) {
  const Shape& sh = shapes()[1];
  Problem p(sh);
  auto m = p.model("reference", "f32");
  Session s(m);
  s.bind(p.context());
  const int64_t ta = int64_t(sh.T) * 2;
  const SampleResult r = s.sample({.seeds = {5, 6, 7}, .temperature = 0.5, .all_steps = true});
  for (int b = 0; b < 3; ++b) {
    std::vector<float> want = gaussian_noise(5 + b, ta);
    for (float& x : want) x = x * 0.5f;
    EXPECT_EQ(std::vector<float>(r.x_steps.begin() + b * ta, r.x_steps.begin() + (b + 1) * ta), want) << b;
  }
  // Sample 1 alone, with its own seed: the same trajectory as in the batch. (Its context names prompt 1
  // of the same cache tensors.)
  const Context batch = p.context();
  KVCache kv1 = batch.kv();
  kv1.B = 1;
  kv1.prompt_of = {1};
  Session alone(m);
  alone.bind(Context::from_views(kv1, {batch.rope_delta()[1]}, std::nullopt, std::vector<float>{(*batch.v0())[1]}));
  const SampleResult a = alone.sample({.seeds = {6}, .temperature = 0.5});
  EXPECT_EQ(a.action, std::vector<float>(r.action.begin() + ta, r.action.begin() + 2 * ta));
  // Temperature 0: every sample starts at zero whatever the seed.
  EXPECT_EQ(s.sample({.seed = 1, .temperature = 0.0}).action, s.sample({.seed = 2, .temperature = 0.0}).action);
  test::expect_error([&] { s.sample({.temperature = -1.0}); }, {"temperature"});
  test::expect_error([&] { s.sample({.temperature = NAN}); }, {"temperature"});
  test::expect_error([&] { s.sample({.seeds = {1, 2}}); }, {"seeds", "B = 3"});
}

// The work split (attention chunks, matmul column blocks, row ranges) depends on the sizes only, never on
// the number of threads (nor, in the cpu backend's matmuls, on which thread takes which chunk), so every backend
// gives bitwise the same results for any thread count: here 1 to 5 threads on shapes whose attention is split
// into several chunks, shared prompts included. One test per target, so that the ThreadSanitizer stage can
// leave out the formats that add no threading code (scripts/test.sh). Each shape is run with 1 thread, then with
// each of the other thread counts.
void expect_thread_count_independent(const std::string& label, const std::string& backend, const std::string& format,
                                     const std::string& kv, std::initializer_list<int> shape_indices,
                                     std::initializer_list<int> threads) {
  for (int si : shape_indices) {
    if (!undeclared(backend, shapes()[si]).empty()) continue;  // listed by BackendFeatures.UndeclaredCases*
    Problem p(shapes()[si]);
    const SampleResult one = run(p.model(backend, format, 1, {}, kv), p.context(), -1).r;
    for (int t : threads)
      EXPECT_EQ(run(p.model(backend, format, t, {}, kv), p.context(), -1).r.action, one.action)
          << label << " " << shapes()[si].name << ": " << t << " threads against 1";
  }
}

class ThreadCountConformance : public ::testing::TestWithParam<Target> {};

TEST_P(ThreadCountConformance, ResultsAreBitwiseIndependentOfThreadCount) {
  const Target& tg = GetParam();
  SKIP_IF_UNAVAILABLE(tg);
  SKIP_UNLESS_THREADED(tg.backend);
  expect_thread_count_independent(target_name(tg), tg.backend, tg.format, "", {2, 4, 6}, {2, 3, 5});
}

INSTANTIATE_TEST_SUITE_P(Backends, ThreadCountConformance, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return target_name(info.param); });

// And with each non-default KV cache (int8: the own rows are quantised by whichever thread runs their rope).
class ThreadCountConformanceKv : public ::testing::TestWithParam<KvTarget> {};

TEST_P(ThreadCountConformanceKv, ResultsAreBitwiseIndependentOfThreadCount) {
  const KvTarget& tg = GetParam();
  SKIP_IF_UNAVAILABLE(tg);
  SKIP_UNLESS_THREADED(tg.backend);
  expect_thread_count_independent(target_name(tg), tg.backend, tg.format, tg.kv, {4, 6}, {2, 3});
}

INSTANTIATE_TEST_SUITE_P(Backends, ThreadCountConformanceKv, ::testing::ValuesIn(kv_targets()),
                         [](const auto& info) { return target_name(info.param); });

#ifdef ALPAMAYO_WITH_CPU_BACKEND
// The AMX attention kernel forced, on both caches (the timed choice above takes it only where it wins): 1 to 5
// threads on the shapes with several chunks and shared prompts, whose cascade puts several samples' rows in one item.
TEST(Conformance, AmxAttentionIsBitwiseIndependentOfThreadCount) {
  if (const std::string why = cpu::attn_kernel_unavailable(cpu::AttnKernel::AmxBf16); !why.empty())
    GTEST_SKIP() << "amx_bf16: " << why;
  for (const std::string kv : {"bf16", "int8"})
    for (int si : {2, 5, 6}) {
      Problem p(shapes()[si]);
      const std::string pin = kv == "int8" ? "attention_kv_int8=amx_bf16" : "attention=amx_bf16";
      const auto one_model = p.model("cpu", "bf16", 1, {}, kv, pin);
      EXPECT_EQ(one_model->kernels().rfind(pin, 0), 0u) << one_model->kernels();
      const SampleResult one = run(one_model, p.context(), -1).r;
      for (int t : {2, 3, 5})
        EXPECT_EQ(run(p.model("cpu", "bf16", t, {}, kv, pin), p.context(), -1).r.action, one.action)
            << kv << " cache, " << shapes()[si].name << ": " << t << " threads against 1";
    }
}

// The AMX int8 matmul forced (the timed choice takes it only where it wins): 1 to 5 threads, and bitwise the
// results of avx512_vnni (both round the exact int32 sums once, with the same epilogues).
TEST(Conformance, AmxInt8MatmulIsBitwiseIndependentOfThreadCountAndEqualsVnni) {
  for (cpu::MatmulKernel k : {cpu::MatmulKernel::AmxInt8, cpu::MatmulKernel::Avx512Vnni})
    if (const std::string why = cpu::matmul_kernel_unavailable(k); !why.empty()) {
      GTEST_SKIP() << cpu::matmul_kernel_name(k) << ": " << why;
    }
  for (int si : {2, 4, 6}) {
    Problem p(shapes()[si]);
    const std::string pin = "matmul_int8=amx_int8";
    const auto one_model = p.model("cpu", "int8", 1, {}, "", pin);
    EXPECT_NE(one_model->kernels().find(pin), std::string::npos) << one_model->kernels();
    const SampleResult one = run(one_model, p.context(), -1).r;
    EXPECT_EQ(run(p.model("cpu", "int8", 2, {}, "", "matmul_int8=avx512_vnni"), p.context(), -1).r.action, one.action)
        << shapes()[si].name << ": avx512_vnni against amx_int8";
    for (int t : {2, 3, 5})
      EXPECT_EQ(run(p.model("cpu", "int8", t, {}, "", pin), p.context(), -1).r.action, one.action)
          << shapes()[si].name << ": " << t << " threads against 1";
  }
}
// The AMX matmuls from 128 rows on (amx_bf16 then runs several chunks per call, both kernels group panels):
// the six-sample shape with 32 rows per sample (192 rows; qkv 12 panels, gate_up 8: runs of chunks that the
// thread counts cut differently), each kernel pinned, 1 to 5 threads; amx_int8 also against avx512_vnni.
TEST(Conformance, AmxMatmulsAtManyRowsAreBitwiseIndependentOfThreadCount) {
  Shape sh = shapes()[6];
  sh.T = 32;
  ASSERT_GE(sh.T * int(sh.ctx.rope_delta.size()), cpu::kAmxManyRows);  // B samples of T rows
  Problem p(sh);
  struct Pin {
    const char* weights;
    cpu::MatmulKernel kernel;
    const char* pin;
  };
  std::string not_run;
  for (const Pin& pin : {Pin{"bf16", cpu::MatmulKernel::AmxBf16, "matmul_bf16=amx_bf16"},
                         Pin{"int8", cpu::MatmulKernel::AmxInt8, "matmul_int8=amx_int8"}}) {
    if (const std::string why = cpu::matmul_kernel_unavailable(pin.kernel); !why.empty()) {
      not_run += std::string(not_run.empty() ? "" : "; ") + pin.pin + ": " + why;
      continue;
    }
    const auto one_model = p.model("cpu", pin.weights, 1, {}, "", pin.pin);
    EXPECT_NE(one_model->kernels().find(pin.pin), std::string::npos) << one_model->kernels();
    const SampleResult one = run(one_model, p.context(), -1).r;
    for (int t : {2, 3, 5})
      EXPECT_EQ(run(p.model("cpu", pin.weights, t, {}, "", pin.pin), p.context(), -1).r.action, one.action)
          << pin.pin << ": " << t << " threads against 1";
    const bool vnni = cpu::matmul_kernel_unavailable(cpu::MatmulKernel::Avx512Vnni).empty();
    if (pin.kernel == cpu::MatmulKernel::AmxInt8 && vnni)
      EXPECT_EQ(run(p.model("cpu", "int8", 2, {}, "", "matmul_int8=avx512_vnni"), p.context(), -1).r.action, one.action)
          << "avx512_vnni against amx_int8";
  }
  if (!not_run.empty()) GTEST_SKIP() << "not run here: " << not_run;
}
#endif  // ALPAMAYO_WITH_CPU_BACKEND

TEST(Conformance, EveryBackendIsTested) {
  // The registry lists the reference first-class too; a build always has it.
  bool has_ref = false;
  for (const Target& t : targets()) has_ref |= t.backend == "reference";
  EXPECT_TRUE(has_ref);
  EXPECT_EQ(find_backend(backend_names().front()).name, backend_names().front());
  // Every backend states its KV cache formats; the reference's int8 is the oracle of every other int8 cache.
  for (const BackendInfo& b : registered_backends()) EXPECT_FALSE(b.kv_formats.empty()) << b.name;
  bool ref_kv_int8 = false;
  for (const KvTarget& t : kv_targets()) ref_kv_int8 |= t.backend == "reference" && t.kv == "int8";
  EXPECT_TRUE(ref_kv_int8);
  test::expect_error([] { find_backend("tpu"); }, {"unknown backend 'tpu'", "reference"});
}

// What the block formats do: the reference with bfp8_b / bfp4_b weights against the exact fp32 reference (only
// the weights differ), under the error model with each weight matrix a site of the error the format puts on it
// (error_model.h: bfp.h's own rounding of these weights); v_k teacher-forced. Besides, the requirement a device port
// is held to: bfp8_b keeps layer 0 (same input on both sides) at PCC >= 0.9999 (the seed measured 0.99993 on
// Blackhole, each layer fed the golden input).
TEST(Conformance, BlockFormatsAgainstF32) {
  for (const std::string format : {"bfp8_b", "bfp4_b"}) {
    for (int si : {1, 3, 4}) {
      const Shape& sh = shapes()[si];
      Problem p(sh);
      const auto oracle = p.model("reference", "f32");
      const RunOut ref = run(oracle, p.context(), 0);
      const RunOut got = run(p.model("reference", format), p.context(), 0);
      const std::string at = "reference/" + format + " vs f32 " + sh.name;
      const ErrorModel em = error_model_for(p, "f32", format, "f32");
      expect_run_close(got, ref, *oracle, p.context(), em, sh, at);
      if (format == "bfp8_b") {
        EXPECT_GE(compare(got.cap.layers[0], ref.cap.layers[0]).pcc, 0.9999) << at;
      }
    }
  }
}

#ifdef ALPAMAYO_WITH_CPU_BACKEND
// The cpu backend's kernels one by one against the reference ops (matmuls per weight format, attention per KV
// cache format, the block formats' kernels) are the op suite's (tests/cpp/ops/, Cpu/Ops.*).

// The whole conformance table once per kernel of the cpu backend, each forced in turn through the model's `kernels`
// option (the other ops keep the timed choice), for every weight format and KV cache format that runs it: what the
// suite checks must not depend on the kernels this machine's timing happens to pick. A kernel this CPU (or
// ALPAMAYO_CPU_ISA) cannot run is reported as skipped with the reason.
struct CpuKernelTarget {
  std::string format, kv, op, kernel;
};
std::vector<CpuKernelTarget> cpu_kernel_targets() {
  std::vector<CpuKernelTarget> v;
  // Only the cache decides here, with every instruction set allowed: the tests are listed before the binary's
  // instruction-set ceiling is set, and each test checks this CPU's when it runs.
  cpu::IsaInfo every;
  every.detected = every.usable = ~0u;
  auto attention = [&](const std::string& format, const std::string& kv) {
    for (cpu::AttnKernel k : cpu::kAttnKernels)
      if (cpu::attn_kernel_unavailable(k, kv == "int8", every).rfind("reads only", 0) != 0)
        v.push_back({format, kv, kv == "int8" ? "attention_kv_int8" : "attention", cpu::attn_kernel_name(k)});
  };
  for (const std::string format : {"bf16", "int8", "bfp8_b", "bfp4_b"}) attention(format, "");
  attention("bf16", "int8");
  for (const std::string format : {"bf16", "int8"}) {
    const bool int8 = format == "int8";
    v.push_back({format, "", int8 ? "matmul_int8" : "matmul_bf16", "onednn"});
    for (cpu::MatmulKernel k : cpu::kMatmulKernels)
      if (int8 ? cpu::matmul_kernel_takes_int8(k) : cpu::matmul_kernel_takes_bf16(k))
        v.push_back({format, "", int8 ? "matmul_int8" : "matmul_bf16", cpu::matmul_kernel_name(k)});
  }
  return v;
}
// Empty when the kernel runs here, else why not.
std::string cpu_kernel_unavailable(const CpuKernelTarget& t) {
  if (t.op.rfind("attention", 0) == 0) {
    for (cpu::AttnKernel k : cpu::kAttnKernels)
      if (t.kernel == cpu::attn_kernel_name(k)) return cpu::attn_kernel_unavailable(k, t.kv == "int8");
    return "unknown attention kernel";
  }
  if (t.kernel == "onednn") {
    if (t.format == "int8" && !cpu::onednn_int8_refused().empty()) return cpu::onednn_int8_refused();
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    cpu::OnednnPrimitives kernels(eng);
    try {  // e.g. no bf16 matmul in oneDNN below AVX-512
      kernels.get(t.format == "int8" ? cpu::WeightType::INT8 : cpu::WeightType::BF16, 64, 1536, 1024, 1024);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  cpu::MatmulKernel k;
  return cpu::matmul_kernel_from_name(t.kernel, &k) ? cpu::matmul_kernel_unavailable(k) : "unknown matmul kernel";
}

class CpuKernelConformance : public ::testing::TestWithParam<std::tuple<CpuKernelTarget, int>> {};

TEST_P(CpuKernelConformance, MatchesTheReference) {
  const auto& [tg, si] = GetParam();
  if (const std::string why = cpu_kernel_unavailable(tg); !why.empty())
    GTEST_SKIP() << tg.op << "=" << tg.kernel << " cannot run on this CPU: " << why;
  const std::string spec = tg.op + "=" + tg.kernel;
  std::string loaded;
  expect_target_matches("cpu", tg.format, tg.kv, spec, si,
                        "cpu/" + tg.format + (tg.kv.empty() ? "" : " kv " + tg.kv) + " " + spec + " " + shapes()[si].name,
                        &loaded);
  EXPECT_NE(loaded.find(spec), std::string::npos) << spec << " not in " << loaded;
}

INSTANTIATE_TEST_SUITE_P(Kernels, CpuKernelConformance,
                         ::testing::Combine(::testing::ValuesIn(cpu_kernel_targets()),
                                            ::testing::Range(0, static_cast<int>(shapes().size()))),
                         [](const auto& info) {
                           const CpuKernelTarget& t = std::get<0>(info.param);
                           return "cpu_" + t.format + (t.kv.empty() ? "" : "_kv_" + t.kv) + "_" + t.op + "_" +
                                  t.kernel + "_" + shapes()[std::get<1>(info.param)].name;
                         });

TEST(Conformance, CpuMatmulKernelChoiceAndErrors) {
  const Shape& sh = shapes()[1];
  Problem p(sh);
  BackendOptions o;
  o.threads = 2;
  o.weights = "bf16";
  {
    BackendOptions bad = o;
    bad.kernels = "matmul_bf16=fastest_ever";
    try {
      load_cpu_backend(p.cfg, p.w, bad);
      ADD_FAILURE() << "an unknown matmul_bf16 kernel was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const char* want : {"fastest_ever", "unknown kernel", "onednn", "avx512_fma", "avx2_fma", "portable_fma"})
        EXPECT_NE(m.find(want), std::string::npos) << want << " not in: " << m;
    }
  }
  // Not forced: the fastest runnable kernel, recorded with the reason.
  auto bm = load_cpu_backend(p.cfg, p.w, o);
  const std::string k = static_cast<const cpu::CpuModel&>(*bm).matmul_kernel();
  bool recorded = false;
  for (const cpu::KernelChoice& c : static_cast<const cpu::CpuModel&>(*bm).kernel_choices())
    if (c.op == "matmul_bf16") {
      recorded = c.kernel == k && (c.why.rfind("fastest of ", 0) == 0 || c.why == "only one");
      std::printf("  matmul_bf16: %s (%s, %.1f GFLOP/s)\n", c.kernel.c_str(), c.why.c_str(), c.gflops);
    }
  EXPECT_TRUE(recorded) << k;
  // A second load of the same shapes reuses the timing (cached per process): the same kernel, the same figure.
  auto gflops = [](const BackendModel& m) {
    for (const cpu::KernelChoice& c : static_cast<const cpu::CpuModel&>(m).kernel_choices())
      if (c.op == "matmul_bf16") return c.gflops;
    return -1.0;
  };
  const double first = gflops(*bm);
  auto again = load_cpu_backend(p.cfg, p.w, o);
  EXPECT_EQ(static_cast<const cpu::CpuModel&>(*again).matmul_kernel(), k);
  EXPECT_EQ(gflops(*again), first);
  // int8: its own choice (op matmul_int8); oneDNN only with VNNI (without it its u8 x s8 kernel saturates).
  o.weights = "int8";
  auto bm8 = load_cpu_backend(p.cfg, p.w, o);
  const std::string k8 = static_cast<const cpu::CpuModel&>(*bm8).matmul_kernel();
  bool recorded8 = false;
  for (const cpu::KernelChoice& c : static_cast<const cpu::CpuModel&>(*bm8).kernel_choices())
    if (c.op == "matmul_int8") {
      recorded8 = c.kernel == k8;
      std::printf("  matmul_int8: %s (%s, %.1f GFLOP/s)\n", c.kernel.c_str(), c.why.c_str(), c.gflops);
    }
  EXPECT_TRUE(recorded8) << k8;
  if (!cpu::onednn_int8_refused().empty()) {
    EXPECT_NE(k8, "onednn");
  }
  // Block formats make no matmul choice.
  o.weights = "bfp8_b";
  auto bmb = load_cpu_backend(p.cfg, p.w, o);
  EXPECT_EQ(static_cast<const cpu::CpuModel&>(*bmb).matmul_kernel(), "");
}

// The `kernels` option forces the attention kernel at load (filled from ALPAMAYO_CPU_KERNELS, which messages
// then name); a name that is unknown or cannot run here is an
// error naming the candidates.
TEST(Conformance, CpuForcedAttentionKernel) {
  const Shape& sh = shapes()[1];
  Problem p(sh);
  BackendOptions o;
  o.threads = 1;
  o.weights = "int8";
  o.kernels_source = "ALPAMAYO_CPU_KERNELS";
  o.kernels = "attention=portable";
  {
    auto bm = load_cpu_backend(p.cfg, p.w, o);
    auto sess = bm->new_session();
    EXPECT_EQ(static_cast<cpu::CpuSession*>(sess.get())->attention_kernel(), cpu::AttnKernel::Portable);
    bool found = false;
    for (const cpu::KernelChoice& c : static_cast<const cpu::CpuModel&>(*bm).kernel_choices())
      if (c.op == "attention") {
        found = true;
        EXPECT_EQ(c.kernel, "portable");
        EXPECT_NE(c.why.find("forced"), std::string::npos) << c.why;
      }
    EXPECT_TRUE(found);
  }
  o.kernels = "attention=avx9000";
  test::expect_error([&] { load_cpu_backend(p.cfg, p.w, o); },
                     {"ALPAMAYO_CPU_KERNELS", "unknown attention kernel \"avx9000\"", "avx512_bf16", "avx512_fma",
                      "avx2_fma", "portable"});
  for (cpu::AttnKernel k : cpu::kAttnKernels)
    if (const std::string why = cpu::attn_kernel_unavailable(k); !why.empty()) {
      o.kernels = std::string("attention=") + cpu::attn_kernel_name(k);
      test::expect_error([&] { load_cpu_backend(p.cfg, p.w, o); },
                         {"ALPAMAYO_CPU_KERNELS", "cannot run here", why, "runnable here", "portable"});
    }
  o.kernels = "attention=avx2_fma,matmul_fp8=x";
  test::expect_error([&] { load_cpu_backend(p.cfg, p.w, o); }, {"ALPAMAYO_CPU_KERNELS", "unknown op \"matmul_fp8\""});
}

// The cpu backend's profile (BackendOptions::profile, Session::profiles): one per run of the layers, with every
// phase's time and the threads' idle share at its barriers (where work stealing shows), the kernels chosen and
// the floor, for each weight format; and the --profile table the CLI prints from it.
TEST(Conformance, CpuProfileTablesEveryPhase) {
  Problem p(shapes()[2]);
  const char* phases[] = {"rms_norm", "qkv matmul", "q/k norm + rope", "attention", "o_proj + residual",
                          "rms_norm2", "gate_up + silu*mul", "down + residual"};
  for (const std::string format : {"bf16", "int8", "bfp8_b"}) {
    Session s(p.model("cpu", format, 2, {}, "", "", true));
    s.bind(p.context());
    ::testing::internal::CaptureStderr();
    const SampleResult r = s.sample({.seed = 11});
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "the engine prints nothing";
    const std::vector<StepProfile>& prof = s.profiles();
    ASSERT_EQ(prof.size(), size_t(r.steps)) << format;
    const StepProfile& last = prof.back();
    EXPECT_EQ(last.weights, format);
    EXPECT_EQ(last.threads, 2);
    EXPECT_EQ(last.L, p.cfg.L);
    ASSERT_EQ(last.phases.size(), std::size(phases));
    double sum = 0;
    for (size_t i = 0; i < last.phases.size(); ++i) {
      EXPECT_EQ(last.phases[i].name, phases[i]);
      EXPECT_GE(last.phases[i].seconds, 0) << phases[i];
      EXPECT_GE(last.phases[i].idle, 0) << phases[i];
      EXPECT_LE(last.phases[i].idle, 1) << phases[i];
      sum += last.phases[i].seconds;
    }
    EXPECT_GT(sum, 0) << format;
    EXPECT_GE(last.wall_seconds, sum * 0.5) << format;
    bool attention = false;
    for (const ProfileKernel& k : last.kernels) attention = attention || k.op == "attention";
    EXPECT_TRUE(attention) << format;
    ASSERT_EQ(last.ops.size(), 2u) << format;
    EXPECT_EQ(last.ops[1].op, "attention");
    for (const ProfileOp& o : last.ops) {
      EXPECT_GT(o.gflop, 0) << o.op;
      EXPECT_GT(o.actual_ms, 0) << o.op;
      EXPECT_GT(o.gbytes, 0) << o.op;  // the roofline's bytes, at the measured read bandwidth
      EXPECT_GT(o.read_gbs, 0) << o.op;
      EXPECT_GE(o.floor_ms, std::max(o.compute_ms, o.memory_ms) * (1 - 1e-9)) << o.op;
      EXPECT_NEAR(o.achieved(), o.gflop / (1e-3 * o.actual_ms), 1e-9 * o.achieved()) << o.op;
    }
    EXPECT_NEAR(last.ops[1].actual_ms, 1e3 * last.phases[3].seconds, 1e-9);

    // The table: each phase's line has ms/layer, ms/step, % and idle %, all in range.
    const std::string err = cpu::format_profile(last);
    ASSERT_EQ(err.rfind("cpu backend profile (" + format + " weights, 2 threads", 0), 0u) << err;
    EXPECT_NE(err.find("idle"), std::string::npos) << err;
    EXPECT_NE(err.find("kernel attention"), std::string::npos) << err;
    EXPECT_NE(err.find("floor"), std::string::npos) << err;
    EXPECT_NE(err.find("of floor"), std::string::npos) << err;
    EXPECT_EQ(err.find("of peak"), std::string::npos) << err;
    double share = 0;
    for (const char* ph : phases) {
      const std::string name = std::string("  ") + ph + " ";
      const size_t at = err.find(name);
      ASSERT_NE(at, std::string::npos) << format << ": no line for " << ph << " in\n" << err;
      const size_t eol = err.find('\n', at);
      std::string line = err.substr(at + name.size(), eol - at - name.size());
      for (char& ch : line)
        if (ch == '%') ch = ' ';
      double per_layer = -1, per_step = -1, pct = -1, idle = -1;
      ASSERT_EQ(std::sscanf(line.c_str(), "%lf %lf %lf %lf", &per_layer, &per_step, &pct, &idle), 4)
          << format << " " << ph << ": '" << line << "'";
      EXPECT_GE(per_layer, 0) << ph;
      EXPECT_NEAR(per_step, per_layer * p.cfg.L, 0.02 + 1e-3 * per_step) << ph;
      EXPECT_GE(idle, 0) << ph;
      EXPECT_LE(idle, 100) << ph;
      share += pct;
    }
    EXPECT_NEAR(share, 100, 0.5) << format;
  }
  // Off by default: no profiles.
  Session off(p.model("cpu", "int8", 2));
  off.bind(p.context());
  off.sample({.seed = 11});
  EXPECT_TRUE(off.profiles().empty());
}

// With guidance each step runs the layers twice (the unguided pass in a session of its own): a profile for each.
TEST(Conformance, CpuProfilesBothPassesOfAGuidedStep) {
  const Shape& sh = shapes()[5];
  Problem p(sh);
  const CtxSpec u = unguided_of_shared_shape();
  Session s(p.model("cpu", "int8", 2, {}, "", "", true));
  s.bind(p.context(), {.guidance = Guidance{p.context(u), 1.5}});
  const SampleResult r = s.sample({.seed = 3});
  ASSERT_EQ(s.profiles().size(), size_t(2 * r.steps));
  // The passes alternate: guided (its cache rows), then unguided (the shorter prompt).
  EXPECT_NE(s.profiles()[0].s_max, s.profiles()[1].s_max);
  for (size_t i = 2; i < s.profiles().size(); ++i) EXPECT_EQ(s.profiles()[i].s_max, s.profiles()[i - 2].s_max);
}

// A model's `kernels` option pins its kernels: what one model reports (Model::kernels) given to another loads the
// same kernels, which sample the same bits; a bad value is an error naming the option, and so is the option on a
// backend without kernel choices.
TEST(Conformance, CpuKernelsOptionPinsTheChoice) {
  const Shape& sh = shapes()[1];
  Problem p(sh);
  for (const std::string format : {"bf16", "int8", "bfp8_b"})
    for (const std::string kv : {"bf16", "int8"}) {
      const std::string at = format + " weights, " + kv + " cache";
      const auto timed = p.model("cpu", format, 2, {}, kv);
      const std::string pin = timed->kernels();
      const std::string attn = kv == "int8" ? "attention_kv_int8=" : "attention=";
      EXPECT_EQ(pin.rfind(attn, 0), 0u) << at << ": " << pin;
      const bool block = format == "bfp8_b";
      EXPECT_EQ(pin.find(",matmul_" + format + "="), block ? std::string::npos : pin.find(',')) << at << ": " << pin;
      const auto forced =
          p.model("cpu", format, 2, {}, kv, "attention=portable,matmul_bf16=portable_fma,matmul_int8=portable_fma");
      EXPECT_EQ(forced->kernels(), attn + "portable" + (block ? "" : ",matmul_" + format + "=portable_fma")) << at;
      const auto pinned = p.model("cpu", format, 2, {}, kv, pin);
      EXPECT_EQ(pinned->kernels(), pin) << at;
      const RunOut a = run(timed, p.context(), -1), b = run(pinned, p.context(), -1);
      EXPECT_EQ(a.r.x_steps, b.r.x_steps) << at;
      EXPECT_EQ(a.r.xyz, b.r.xyz) << at;
    }
  test::expect_error([&] { p.model("cpu", "int8", 1, {}, "", "attention=avx9000"); },
                     {"kernels", "unknown attention kernel \"avx9000\"", "avx2_fma", "portable"});
  test::expect_error([&] { p.model("cpu", "int8", 1, {}, "", "matmul_int8=fastest_ever"); },
                     {"kernels: matmul_int8=fastest_ever cannot be used", "unknown kernel", "Candidates"});
  test::expect_error([&] { p.model("cpu", "bf16", 1, {}, "", "attention=avx2_fma,matmul_fp8=x"); },
                     {"kernels=\"attention=avx2_fma,matmul_fp8=x\"", "unknown op \"matmul_fp8\""});
  test::expect_error([&] { p.model("cpu", "bf16", 1, {}, "", "attention"); }, {"\"attention\" is not op=kernel"});
  test::expect_error([&] { p.model("reference", "f32", 1, {}, "", "attention=avx2_fma"); },
                     {"backend reference", "kernels \"attention=avx2_fma\"", "no kernels to choose"});
}

// Two models in one process with different pins each run their own kernels: sessions of both, interleaved, sample
// what a model loaded alone with that pin samples, bit for bit, and each model reports its own choices.
TEST(Conformance, CpuModelsInOneProcessKeepTheirOwnKernels) {
  Problem p(shapes()[1]);
  const std::string slow = "attention=portable,matmul_int8=portable_fma";
  std::string fast;
  RunOut alone_slow, alone_fast;
  {
    const auto m = p.model("cpu", "int8", 2, {}, "", slow);
    alone_slow = run(m, p.context(), -1);
  }
  {
    const auto m = p.model("cpu", "int8", 2);  // timed: the fastest kernels here
    fast = m->kernels();
    alone_fast = run(m, p.context(), -1);
  }
  ASSERT_NE(fast, slow) << "the timed choice is the portable one: nothing to tell apart";
  const auto a = p.model("cpu", "int8", 2, {}, "", slow);
  const auto b = p.model("cpu", "int8", 2, {}, "", fast);
  EXPECT_EQ(a->kernels(), slow);
  EXPECT_EQ(b->kernels(), fast);
  for (const auto& [m, want] : {std::pair{a, slow}, std::pair{b, fast}}) {
    const auto& cm = static_cast<const cpu::CpuModel&>(m->backend());
    EXPECT_EQ(cpu::kernel_pin(cm.kernel_choices()), want);
    for (const cpu::KernelChoice& c : cm.kernel_choices()) EXPECT_EQ(c.why, "forced by kernels") << c.op;
  }
  Session sa(a), sb(b);
  sa.bind(p.context());
  sb.bind(p.context());
  const SampleResult rb = sb.sample({.seed = 11, .all_steps = true});
  const SampleResult ra = sa.sample({.seed = 11, .all_steps = true});
  EXPECT_EQ(ra.x_steps, alone_slow.r.x_steps);
  EXPECT_EQ(rb.x_steps, alone_fast.r.x_steps);
  EXPECT_EQ(ra.xyz, alone_slow.r.xyz);
  EXPECT_EQ(rb.xyz, alone_fast.r.xyz);
  EXPECT_NE(ra.x_steps, rb.x_steps) << "the two pins' kernels differ in rounding";
}

// Instruction-set caps are per model too: a model capped to AVX2 chooses among the AVX2 kernels while an uncapped
// one loaded beside it keeps everything this CPU has, and the capped model samples what its own pin samples.
TEST(Conformance, CpuIsaCapIsPerModel) {
  Problem p(shapes()[1]);
  const auto capped = p.model("cpu", "bf16", 2, {}, "", "", false, "avx2");
  const auto open = p.model("cpu", "bf16", 2);
  const auto& cc = static_cast<const cpu::CpuModel&>(capped->backend());
  const auto& co = static_cast<const cpu::CpuModel&>(open->backend());
  EXPECT_EQ(cc.isa().usable & ~cpu::isa_cap_from_name("avx2"), 0u) << cc.isa().describe();
  EXPECT_EQ(co.isa().usable, cpu::isa().usable) << co.isa().describe();
  if (cc.isa().usable != cc.isa().detected)
    EXPECT_NE(cc.isa().describe().find("[off by isa_cap=avx2"), std::string::npos) << cc.isa().describe();
  for (const cpu::KernelChoice& c : cc.kernel_choices()) {
    EXPECT_EQ(c.instruction.find("zmm"), std::string::npos) << c.op << "=" << c.kernel;
    EXPECT_NE(c.kernel, "onednn") << "oneDNN is not capped per model";
    std::printf("  capped to avx2: %s\n", cpu::format_kernel_choice(c).c_str());
  }
  const auto pinned = p.model("cpu", "bf16", 2, {}, "", capped->kernels());
  const RunOut a = run(capped, p.context(), -1), b = run(pinned, p.context(), -1);
  EXPECT_EQ(a.r.x_steps, b.r.x_steps);
  test::expect_error([&] { p.model("cpu", "bf16", 1, {}, "", "", false, "avx3"); },
                     {"isa_cap=\"avx3\" is not an instruction-set cap", "avx2, avx2_vnni"});
}
#endif

}  // namespace
}  // namespace alpamayo
