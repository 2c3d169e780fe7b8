#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "alpamayo/context.h"
#include "alpamayo/engine.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using namespace test;  // expect_error, TempDir, TensorSet, tiny_spec

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
  expect_bad([](TensorSet& s) { s.t["rope_delta"] = Tensor::i64({3}); }, {"rope_delta has 3 samples", "G = 2 prompts"});
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

// The cache scan reads chunks of 2048 values at a time: a non-finite value is found, at its exact index, in any
// chunk, at either edge of one and in the partial chunk at the end, for each float dtype; padding rows (left and
// right of the attended rows) are not scanned.
TEST(Context, NonFiniteCacheValuesFoundAcrossScanChunks) {
  const int Hkv = 2, P = 120, d = 64, pad = 7, valid = 101;  // 94 attended rows: 6016 values, 2 chunks + 1920
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    const size_t es = dtype_size(dt), n = size_t(Hkv) * P * d;
    std::vector<uint8_t> key(n * es, 0), value(n * es, 0);
    auto put = [&](std::vector<uint8_t>& buf, size_t i, float v) {
      if (dt == DType::F32) std::memcpy(buf.data() + 4 * i, &v, 4);
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      if (dt != DType::F32) std::memcpy(buf.data() + 2 * i, &h, 2);
    };
    for (size_t i = 0; i < n; ++i) {
      put(key, i, 0.25f * float(i % 7) - 0.5f);
      put(value, i, 1.5f - 0.125f * float(i % 5));
    }
    auto context = [&] {
      KVCache kv;
      kv.B = kv.G = 1;
      kv.Hkv = Hkv;
      kv.P = P;
      kv.d = d;
      kv.valid_len = {valid};
      kv.prefix_pad = {pad};
      kv.key = {TensorView{dt, {1, Hkv, P, d}, key.data(), "key.0"}};
      kv.value = {TensorView{dt, {1, Hkv, P, d}, value.data(), "value.0"}};
      return Context::from_views(kv, {0}, std::nullopt, std::vector<float>{1.f});
    };
    ASSERT_NO_THROW(context()) << dtype_name(dt);
    // Offsets into head 1's attended rows, which start at row `pad`: the first value, each chunk edge, the tail.
    for (int64_t off : {0, 5, 2047, 2048, 2049, 4095, 4096, 6015}) {
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        const size_t i = (size_t(1) * P + pad) * d + size_t(off);
        std::vector<uint8_t>& buf = off % 2 ? value : key;
        const std::vector<uint8_t> keep = buf;
        put(buf, i, bad);
        const std::string where = "[0, 1, " + std::to_string(pad + off / d) + ", " + std::to_string(off % d) + "]";
        SCOPED_TRACE(std::string(dtype_name(dt)) + " offset " + std::to_string(off));
        expect_error([&] { context(); }, {off % 2 ? "value.0" : "key.0", "non-finite", where});
        buf = keep;
      }
    }
    // Padding rows of head 0 (before `pad`, at and after `valid`) may hold anything.
    for (int row : {0, pad - 1, valid, P - 1}) put(key, size_t(row) * d + 3, NAN);
    EXPECT_NO_THROW(context()) << dtype_name(dt);
  }
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

// Shared prompts, per-sample suffixes and left padding in a file: read as written, equal to the same
// cache laid out as one full row set per sample (the prompt copied, then the suffix), bitwise on the
// reference backend.
TEST(Context, SharedPromptFileMatchesPerSampleCopies) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec());
  auto ck = Checkpoint::open(tmp / "ck");
  SyntheticContextSpec cs;
  cs.B = 3;
  cs.G = 2;
  cs.P = 12;
  cs.valid_len = {12, 9};
  cs.prefix_pad = {2, 0};
  cs.prompt_index = {1, 0, 0};
  cs.Q = 5;
  cs.suffix_len = {5, 0, 3};
  cs.rope_delta = {-3, 4, 4};
  cs.history = 0;
  write_synthetic_context(tmp / "shared", ck->config(), cs);
  const Context c = Context::open(tmp / "shared");
  const KVCache& kv = c.kv();
  EXPECT_EQ(c.batch(), 3);
  EXPECT_EQ(kv.G, 2);
  EXPECT_EQ(kv.prompt_of, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(kv.prefix_pad, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(kv.suffix_len, (std::vector<int64_t>{5, 0, 3}));
  EXPECT_EQ(kv.offset(0), 9 + 5);
  EXPECT_EQ(kv.offset(2), 12 + 3);
  EXPECT_EQ(kv.attended(1), 10);

  // The same rows as one [B, Hkv, P', d] cache per layer: prompt rows (padding kept, masked by prefix_pad is
  // not expressible there, so it is dropped and the rope offset kept through rope_delta), then the suffix.
  const int Hkv = kv.Hkv, d = kv.d, P2 = kv.P + kv.Q;
  std::vector<std::vector<uint16_t>> store;
  KVCache flat;
  flat.B = flat.G = 3;
  flat.Hkv = Hkv;
  flat.d = d;
  flat.P = P2;
  std::vector<int64_t> rd(3);
  for (int b = 0; b < 3; ++b) {
    flat.valid_len.push_back(kv.attended(b));
    rd[b] = c.rope_delta()[b] + kv.offset(b) - kv.attended(b);  // the same rotary positions
  }
  for (size_t l = 0; l < kv.key.size(); ++l)
    for (int which = 0; which < 2; ++which) {
      const auto* prompt = static_cast<const uint16_t*>((which ? kv.value : kv.key)[l].data);
      const auto* sfx = static_cast<const uint16_t*>((which ? kv.suffix_value : kv.suffix_key)[l].data);
      auto& buf = store.emplace_back(size_t(3) * Hkv * P2 * d, 0);
      for (int b = 0; b < 3; ++b)
        for (int h = 0; h < Hkv; ++h) {
          const int g = kv.prompt(b);
          uint16_t* dst = buf.data() + (size_t(b) * Hkv + h) * P2 * d;
          const uint16_t* src = prompt + ((size_t(g) * Hkv + h) * kv.P + kv.pad(g)) * d;
          const size_t np = size_t(kv.valid_len[g] - kv.pad(g)) * d;
          std::copy(src, src + np, dst);
          std::copy(sfx + (size_t(b) * Hkv + h) * kv.Q * d, sfx + ((size_t(b) * Hkv + h) * kv.Q + kv.suffix(b)) * d,
                    dst + np);
        }
      (which ? flat.value : flat.key).push_back(TensorView{DType::BF16, {3, Hkv, P2, d}, buf.data(), "flat"});
    }
  Session s(Model::load(ck, "reference"));
  s.bind(c);
  const SampleResult a = s.sample({.seed = 9});
  s.bind(Context::from_views(flat, rd, std::nullopt, *c.v0()));
  EXPECT_EQ(s.sample({.seed = 9}).action, a.action);
}

TEST(Context, SharedPromptErrors) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec());
  auto ck = Checkpoint::open(tmp / "ck");
  SyntheticContextSpec cs;
  cs.B = 2;
  cs.G = 1;
  cs.P = 8;
  cs.Q = 4;
  cs.prefix_pad = {1};
  write_synthetic_context(tmp / "ok", ck->config(), cs);
  auto edit = [&](const std::function<void(TensorSet&)>& fn) {
    TensorSet t = TensorSet::read(tmp / "ok");
    fn(t);
    t.write(tmp / "bad");
  };
  auto set_i64 = [](TensorSet& t, const std::string& name, std::vector<int64_t> v) {
    t.t[name] = Tensor::i64({static_cast<int64_t>(v.size())}, v.data());
    if (std::find(t.names.begin(), t.names.end(), name) == t.names.end()) t.names.push_back(name);
  };
  edit([&](TensorSet& t) { set_i64(t, "prompt_index", {0, 1}); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"prompt_index[1] = 1", "G = 1"});
  edit([&](TensorSet& t) { set_i64(t, "suffix_len", {4, 5}); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"suffix_len[1] = 5", "Q = 4"});
  edit([&](TensorSet& t) { set_i64(t, "prefix_pad", {9}); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"prefix_pad[0] = 9", "valid_len = 8"});
  edit([&](TensorSet& t) { t.erase("suffix_len"); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"suffix_len must be given together"});
  edit([&](TensorSet& t) { t.erase("prompt_index"); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"rope_delta has 2 samples", "G = 1 prompts", "prompt_index"});
  edit([&](TensorSet& t) { t.erase("suffix_value.1"); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"suffix_value.1"});
  edit([&](TensorSet& t) { set_i64(t, "rope_delta", {1, 2, 3}); });
  expect_error([&] { Context::open(tmp / "bad"); }, {"rope_delta", "[2]", "[3]"});
  // NaN in a suffix row that a sample reads is found; in a row beyond suffix_len it is allowed.
  edit([&](TensorSet& t) {
    auto* p = reinterpret_cast<uint16_t*>(t.t.at("suffix_key.0").bytes.data());
    p[0] = 0x7fc0;  // sample 0, head 0, row 0
  });
  expect_error([&] { Context::open(tmp / "bad"); }, {"suffix_key.0", "non-finite", "[0, 0, 0, 0]"});
}

}  // namespace
}  // namespace alpamayo
