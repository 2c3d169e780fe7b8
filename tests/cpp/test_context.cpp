#include <cmath>

#include "alpamayo/context.h"
#include "alpamayo/engine.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::expect_error;
using test::TempDir;
using test::TensorSet;
using test::tiny_spec;

struct Fixture {
  TempDir tmp;
  std::shared_ptr<const Checkpoint> ck;
  std::string ctx;
  Fixture(int history = 4) {
    write_synthetic_checkpoint(tmp / "ck", tiny_spec());
    ck = Checkpoint::open(tmp / "ck");
    SyntheticContextSpec cs;
    cs.B = 2;
    cs.P = 10;
    cs.valid_len = {10, 4};
    cs.rope_delta = {2, -6};
    cs.history = history;
    ctx = tmp / "ctx.safetensors";
    write_synthetic_context(ctx, ck->config(), cs);
  }
};

TEST(Context, ReadsWhatTheSyntheticWriterWrites) {
  Fixture f;
  Context c = Context::open(f.ctx);
  EXPECT_EQ(c.batch(), 2);
  EXPECT_EQ(c.layers(), 2);
  EXPECT_EQ(c.kv().P, 10);
  EXPECT_EQ(c.kv().valid_len, (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(c.rope_delta(), (std::vector<int64_t>{2, -6}));
  ASSERT_TRUE(c.history().has_value());
  EXPECT_EQ(c.history()->H, 4);
  c.check_compatible(f.ck->config());
}

TEST(Context, Errors) {
  Fixture f;
  const TensorSet orig = TensorSet::read(f.ctx);
  auto expect_bad = [&](const std::function<void(TensorSet&)>& edit, std::initializer_list<std::string> parts) {
    TensorSet s = orig;
    edit(s);
    s.write(f.ctx);
    expect_error([&] { Context::open(f.ctx); }, parts);
  };
  expect_bad([](TensorSet& s) { reinterpret_cast<int64_t*>(s.t["valid_len"].bytes.data())[1] = 11; },
             {"ctx.safetensors", "valid_len[1] = 11", "P = 10"});
  expect_bad([](TensorSet& s) { reinterpret_cast<int64_t*>(s.t["valid_len"].bytes.data())[0] = -1; }, {"valid_len[0] = -1"});
  expect_bad([](TensorSet& s) { s.t["rope_delta"] = Tensor::i64({3}); }, {"rope_delta", "[2]", "[3]"});
  expect_bad([](TensorSet& s) { s.t["valid_len"] = Tensor::f32({2}); }, {"valid_len", "I64", "F32"});
  expect_bad([](TensorSet& s) { s.erase("rope_delta"); }, {"missing tensor 'rope_delta'"});
  expect_bad([](TensorSet& s) { s.erase("ego_history_rot"); }, {"ego_history_xyz and ego_history_rot"});
  expect_bad([](TensorSet& s) { s.erase("key.0"); }, {"key.0"});
  expect_bad([](TensorSet& s) { s.erase("value.1"); }, {"missing tensor 'value.1'"});
  expect_bad([](TensorSet& s) { s.t["key.1"].shape = {2, 2, 20, 8}; }, {"key.1", "[2, 2, 10, 16]", "[2, 2, 20, 8]"});
  expect_bad([](TensorSet& s) { s.t["value.0"].dtype = DType::I16; }, {"value.0", "I16"});
  // NaN / Inf in a valid row is an error; in a padding row (sample 1, rows >= 4) it is ignored.
  auto set_bf16 = [](Tensor& t, int64_t idx, float v) { reinterpret_cast<uint16_t*>(t.bytes.data())[idx] = f32_to_bf16(v); };
  expect_bad([&](TensorSet& s) { set_bf16(s.t["key.1"], ((0 * 2 + 1) * 10 + 3) * 16 + 5, NAN); }, {"key.1", "non-finite", "[0, 1, 3, 5]"});
  expect_bad([&](TensorSet& s) { set_bf16(s.t["value.0"], ((1 * 2 + 0) * 10 + 2) * 16, INFINITY); }, {"value.0", "[1, 0, 2, 0]"});
  expect_bad([](TensorSet& s) { s.t["ego_history_xyz"].f32_data()[4] = NAN; }, {"ego_history_xyz", "non-finite"});
  TensorSet s = orig;
  set_bf16(s.t["key.1"], ((1 * 2 + 1) * 10 + 7) * 16, NAN);
  s.write(f.ctx);
  EXPECT_NO_THROW(Context::open(f.ctx));
}

TEST(Context, MustMatchTheExpert) {
  Fixture f;
  TempDir tmp;
  auto spec = tiny_spec();
  spec.L = 3;
  write_synthetic_checkpoint(tmp / "ck3", spec);
  Session eng(Model::load(Checkpoint::open(tmp / "ck3"), "reference"));
  expect_error([&] { eng.bind(Context::open(f.ctx)); }, {"ctx.safetensors", "2 cache layers", "3 layers"});
  spec = tiny_spec();
  spec.Hq = 8;
  spec.Hkv = 4;
  write_synthetic_checkpoint(tmp / "ckh", spec);
  Session eng2(Model::load(Checkpoint::open(tmp / "ckh"), "reference"));
  expect_error([&] { eng2.bind(Context::open(f.ctx)); }, {"2 KV heads", "4"});
  expect_error([&] { find_backend("tpu"); }, {"unknown backend 'tpu'"});
}

TEST(Context, NeedsV0OrHistory) {
  Fixture f(0);  // writes v0 instead of a history
  Session eng(Model::load(f.ck, "reference"));
  eng.bind(Context::open(f.ctx));
  SampleOptions o;
  o.steps = 1;
  EXPECT_EQ(eng.sample(o).v0_source, "context v0");
  TensorSet s = TensorSet::read(f.ctx);
  s.erase("v0");
  s.write(f.ctx);
  eng.bind(Context::open(f.ctx));
  expect_error([&] { eng.sample(o); }, {"neither v0 nor ego_history"});
  o.v0 = 3.0;
  const SampleResult r = eng.sample(o);
  EXPECT_EQ(r.v0_source, "given");
  EXPECT_EQ(r.v0[1], 3.0f);
}

}  // namespace
}  // namespace alpamayo
