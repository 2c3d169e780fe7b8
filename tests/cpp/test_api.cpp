// The embedding API as the README shows it: contexts built over the caller's own buffers.
#include <algorithm>

#include "alpamayo/engine.h"
#include "conformance_util.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::TempDir;
using test::tiny_spec;

TEST(Api, ContextFromCallerBuffersMatchesTheFile) {
  TempDir tmp;
  for (DType dt : {DType::F32, DType::F16}) {
    auto spec = tiny_spec(Layout::R1);
    spec.dtype = dt;  // f16 and f32 checkpoints load like the bf16 releases
    write_synthetic_checkpoint(tmp / "ck", spec);
    auto ck = Checkpoint::open(tmp / "ck");
    EXPECT_EQ(ck->expert().layers[0].q.dtype, dt);
    SyntheticContextSpec cs;
    cs.B = 2;
    cs.P = 9;
    cs.valid_len = {9, 3};
    cs.rope_delta = {-4, 11};
    write_synthetic_context(tmp / "ctx", ck->config(), cs);

    for (const std::string& backend : backend_names()) {
      if (!find_backend(backend).unavailable().empty()) continue;  // e.g. cuda without a GPU: skipped elsewhere
      Session from_file(Model::load(ck, backend));
      from_file.bind(Context::open(tmp / "ctx"));
      const SampleResult want = from_file.sample({.seed = 42});

      // The same cache copied into the caller's own memory, as an integrating C++ stack would hold it.
      Context file = Context::open(tmp / "ctx");
      std::vector<std::vector<uint8_t>> owned;
      KVCache kv = file.kv();
      for (auto* list : {&kv.key, &kv.value})
        for (TensorView& t : *list) {
          owned.emplace_back(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes());
          t.data = owned.back().data();
          t.name = "caller buffer";
        }
      Session engine(Model::load(ck, backend));
      engine.bind(Context::from_views(kv, file.rope_delta(), file.history(), std::nullopt));
      const SampleResult got = engine.sample({.seed = 42});
      EXPECT_EQ(got.action, want.action) << backend;
      EXPECT_EQ(got.xyz, want.xyz) << backend;
      EXPECT_EQ(got.v0, want.v0) << backend;

      // Validation applies to caller views too.
      kv.valid_len[1] = 10;
      test::expect_error([&] { Context::from_views(kv, file.rope_delta(), std::nullopt, std::vector<float>{1.f, 2.f}); },
                         {"valid_len[1] = 10"});
    }
  }
}

// The KV cache format (BackendOptions::kv): empty is the backend's first; an unknown one is refused before the
// backend sees it, naming the backend, the format and the offered ones (every backend, also one that cannot run
// here: the formats are checked first).
TEST(KvFormat, UnknownFormatsAreRefusedNamingTheOfferedOnes) {
  conformance::Problem p(conformance::shapes()[0]);
  for (const BackendInfo& b : registered_backends()) {
    ASSERT_FALSE(b.kv_formats.empty()) << b.name;
    std::string offered;
    for (const std::string& f : b.kv_formats) offered += (offered.empty() ? "" : ", ") + f;
    std::vector<std::string> bad = {"fp16", "INT8", " int8"};
    for (const std::string f : {"bf16", "f32", "int8"})  // every format some backend offers, where this one does not
      if (std::find(b.kv_formats.begin(), b.kv_formats.end(), f) == b.kv_formats.end()) bad.push_back(f);
    for (const std::string& f : bad)
      test::expect_error([&] { p.model(b.name, b.weight_formats.front(), 2, {}, f); },
                         {"backend " + b.name + ": unknown KV cache format '" + f + "' (it offers " + offered + ")"});
    if (!b.unavailable().empty()) continue;
    EXPECT_EQ(p.model(b.name, "")->kv(), b.kv_formats.front()) << b.name;
    EXPECT_EQ(p.model(b.name, "", 2, {}, b.kv_formats.front())->kv(), b.kv_formats.front()) << b.name;
  }
  EXPECT_EQ(find_backend("reference").kv_formats, (std::vector<std::string>{"f32", "int8"}));
  EXPECT_EQ(p.model("reference", "", 2, {}, "int8")->kv(), "int8");
}

// The reference with the int8 KV cache against itself with the f32 cache, on shapes with padding rows full of NaN
// (never read, so never quantised), empty caches, shared prompts with suffixes and left padding: close (the rows
// move by at most half a step of a / 127 each) but not bitwise equal, and deterministic.
TEST(KvFormat, ReferenceInt8IsCloseToF32ButNotEqual) {
  for (int si : {0, 1, 3, 5}) {
    const conformance::Shape& sh = conformance::shapes()[si];
    conformance::Problem p(sh);
    const conformance::RunOut f32 = conformance::run(p.model("reference", "f32"), p.context(), 0);
    const conformance::RunOut i8 = conformance::run(p.model("reference", "f32", 2, {}, "int8"), p.context(), 0);
    EXPECT_NE(i8.r.action, f32.r.action) << sh.name;
    EXPECT_EQ(conformance::run(p.model("reference", "f32", 3, {}, "int8"), p.context(), 0).r.action, i8.r.action)
        << sh.name << ": 3 threads against 2";
    for (int l = 0; l < sh.L; ++l) {
      const conformance::Stats st = conformance::compare(i8.cap.layers[l], f32.cap.layers[l]);
      EXPECT_NE(i8.cap.layers[l], f32.cap.layers[l]) << sh.name << " layer " << l;
      EXPECT_GE(st.pcc, 0.9999) << sh.name << " layer " << l;
      EXPECT_LE(st.max_abs, 0.02 * st.ref_max) << sh.name << " layer " << l;
    }
    const conformance::Stats x = conformance::compare(i8.r.action, f32.r.action);
    EXPECT_GE(x.pcc, 0.999) << sh.name;
    double dev = 0, extent = 0;
    for (size_t i = 0; i < i8.r.xyz.size(); ++i) {
      dev = std::max(dev, double(std::fabs(i8.r.xyz[i] - f32.r.xyz[i])));
      extent = std::max(extent, double(std::fabs(f32.r.xyz[i])));
    }
    if (std::getenv("ALPAMAYO_CONFORMANCE_REPORT"))
      std::printf("  reference kv int8 vs f32 %-30s x_N pcc %.7f, trajectory %.2e m of %.1f m\n", sh.name.c_str(),
                  x.pcc, dev, extent);
    EXPECT_LE(dev, 0.05 * extent) << sh.name;
  }
}

}  // namespace
}  // namespace alpamayo
