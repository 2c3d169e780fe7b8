// The embedding API as the README shows it: contexts built over the caller's own buffers.
#include "alpamayo/engine.h"
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

}  // namespace
}  // namespace alpamayo
