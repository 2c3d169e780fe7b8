// Backend capabilities are data (BackendInfo::features): Session::bind refuses a context that needs an undeclared
// feature, once, naming the backend and the feature, and the conformance suite derives its matrix from the
// declarations. Proven with a test-only backend, `minimal`: the reference's math declaring no feature at all,
// registered the way a program adds a backend (register_backend before anything lists the backends). The
// conformance suite then runs it on the plain shapes and lists its other cases as skipped.
#include <gtest/gtest.h>

#include <cstdio>

#include "alpamayo/limits.h"
#include "backends/reference/reference_backend.h"
#include "conformance_util.h"
#include "test_util.h"

namespace alpamayo {
namespace {

using namespace conformance;

BackendInfo minimal_backend() {
  BackendInfo b = reference_backend_info();
  b.name = "minimal";
  b.weight_formats = {"f32"};
  b.kv_formats = {"f32"};
  b.features = {};
  b.features.max_batch = [](const ExpertConfig&) { return int64_t(4); };
  return b;
}
const bool registered = (register_backend(minimal_backend()), true);

// An unguided context for a shape's guided one: the same layout, rotary positions one further.
CtxSpec unguided_spec(const Shape& sh) {
  CtxSpec u = sh.ctx;
  for (int64_t& d : u.rope_delta) d += 1;
  return u;
}

TEST(BackendFeatures, ContextFeaturesAreWhatTheLayoutUses) {
  ASSERT_TRUE(registered);
  const std::vector<std::vector<std::string>> want = {
      {}, {}, {}, {}, {}, {"shared prompts", "suffix rows", "left padding"},
      {"shared prompts", "suffix rows", "left padding"}};
  ASSERT_EQ(shapes().size(), want.size());
  for (size_t si = 0; si < shapes().size(); ++si) {
    Problem p(shapes()[si]);
    EXPECT_EQ(context_features(p.context().kv()), want[si]) << shapes()[si].name;
  }
  // An explicit identity prompt_of and zero padding need nothing.
  KVCache kv;
  kv.G = kv.B = 2;
  kv.valid_len = {3, 4};
  kv.prompt_of = {0, 1};
  kv.prefix_pad = {0, 0};
  EXPECT_TRUE(context_features(kv).empty());
  kv.prompt_of = {1, 0};  // a permutation still shares nothing, but is not what a plain backend reads
  EXPECT_EQ(context_features(kv), std::vector<std::string>{"shared prompts"});
}

TEST(BackendFeatures, EveryRegisteredBackendDeclaresItsFeatures) {
  for (const BackendInfo& b : registered_backends()) {
    const BackendFeatures& f = b.features;
    std::printf("  %-10s shared prompts %d, suffix rows %d, left padding %d, guidance %d, device memory %d, strided "
                "cache %d, paged cache %d, traces non-finite %d, host threads %d%s\n",
                b.name.c_str(), f.shared_prompts, f.suffix_rows, f.left_padding, f.guidance, f.device_memory,
                f.strided_cache, f.paged_cache, f.traces_non_finite, f.host_threads, f.max_batch ? ", batch limit" : "");
  }
  EXPECT_TRUE(find_backend("reference").features.shared_prompts);
  EXPECT_TRUE(find_backend("reference").features.paged_cache);
  EXPECT_TRUE(find_backend("reference").features.strided_cache);
  EXPECT_FALSE(find_backend("minimal").features.paged_cache);
  EXPECT_TRUE(find_backend("reference").features.guidance);
  EXPECT_FALSE(find_backend("minimal").features.suffix_rows);
}

// Every case the conformance suite skips for a backend is one Session::bind refuses, with the backend and the
// feature named and the session left unbound; every case it runs binds. The skipped (backend, case) pairs are
// printed with their reasons.
TEST(BackendFeatures, UndeclaredCasesAreRefusedAtBindAndListed) {
  int refused = 0;
  for (const Shape& sh : shapes()) {
    Problem p(sh);
    for (const BackendInfo& b : registered_backends()) {
      const bool runs = b.unavailable().empty();
      const auto m = runs ? p.model(b.name, b.weight_formats.front()) : nullptr;
      for (bool guided : {false, true}) {
        const std::string why = undeclared(b.name, sh, guided);
        const std::string at = b.name + " " + sh.name + (guided ? " guided" : "");
        if (!why.empty()) std::printf("  skipped: %-40s %s\n", at.c_str(), why.c_str());
        if (!runs) continue;
        Session s(m);
        BindOptions o;
        if (guided) o.guidance = Guidance{p.context(unguided_spec(sh)), 1.5};
        if (why.empty()) {
          s.bind(p.context(), o);
          EXPECT_TRUE(s.bound()) << at;
          continue;
        }
        const std::string feature = why.substr(why.find("does not declare ") + 17);
        test::expect_error([&] { s.bind(p.context(), o); }, {"the " + b.name + " backend does not run " + feature});
        EXPECT_FALSE(s.bound()) << at;
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 0) << "the minimal backend declares nothing: its shared-prompt cases must be refused";
}

TEST(BackendFeatures, RefusalNamesTheBackendsThatRunTheCase) {
  Problem p(shapes()[5]);
  Session s(p.model("minimal", "f32"));
  test::expect_error([&] { s.bind(p.context()); },
                     {"the minimal backend does not run shared prompts", "(backends that do:", "reference"});
  // Guidance alone, on a plain context.
  Problem q(shapes()[1]);
  Session g(q.model("minimal", "f32"));
  CtxSpec u = shapes()[1].ctx;
  u.rope_delta = {1, 2, 3};
  test::expect_error([&] { g.bind(q.context(), {.guidance = Guidance{q.context(u), 0.5}}); },
                     {"the minimal backend does not run classifier-free guidance"});
  // The batch limit: 6 samples where 4 are allowed.
  Problem r(shapes()[6]);
  CtxSpec six = shapes()[6].ctx;
  six.prompt_of.clear();
  six.pad.clear();
  six.S.assign(6, 600);
  six.suffix.clear();
  six.Q = 0;
  Session m(r.model("minimal", "f32"));
  test::expect_error([&] { m.bind(r.context(six)); }, {"minimal backend does not run a batch of 6 samples", "at most 4"});
  EXPECT_FALSE(m.bound());
}

// The memory a backend declares is what the estimates add: the reference converts one layer at a time, the
// minimal backend (its copy) declares the same, a backend declaring nothing adds only the common host part.
TEST(BackendFeatures, MemoryEstimatesComeFromTheDeclarations) {
  Problem p(shapes()[1]);
  const KVCache kv = p.context().kv();
  const MemoryEstimate ref = estimate_session_memory(p.cfg, "reference", kv, nullptr, false);
  const MemoryEstimate min = estimate_session_memory(p.cfg, "minimal", kv, nullptr, false);
  EXPECT_EQ(ref.bytes, min.bytes);
  EXPECT_NE(ref.parts.find("one layer's weights and caches in f32"), std::string::npos) << ref.parts;
  EXPECT_EQ(estimate_model_memory(p.cfg, "reference", "f32").bytes,
            estimate_model_memory(p.cfg, "minimal", "f32").bytes);  // weights stay in the checkpoint's mapping
}

}  // namespace
}  // namespace alpamayo
