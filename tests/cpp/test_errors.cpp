// Error codes: each one raised where it belongs, by real inputs (missing and malformed files, unknown backends,
// NaN inputs, a memory limit, calls out of order), so that the C API and Python can map them one to one.
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "alpamayo/engine.h"
#include "alpamayo/limits.h"
#include "alpamayo/output.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::ScopedEnv;
using test::TempDir;
using test::TensorSet;
using test::tiny_spec;

// Expects fn to throw an Error with this code whose message contains `part`.
void expect_code(const std::function<void()>& fn, ErrorCode code, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "expected an error (" << error_code_name(code) << ") naming " << part;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(error_code_name(e.code())), error_code_name(code)) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what() << "\nmissing: " << part;
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A tiny checkpoint and a context for it, in a temporary directory.
struct Files {
  TempDir dir;
  std::string ck = dir / "ck", ctx = dir / "ctx.safetensors";
  Files() {
    write_synthetic_checkpoint(ck, tiny_spec());
    SyntheticContextSpec cs;
    cs.P = 32;
    write_synthetic_context(ctx, Checkpoint::open(ck)->config(), cs);
  }
};

TEST(Errors, CodesAndDefaults) {
  EXPECT_EQ(Error("x").code(), ErrorCode::InvalidArgument);  // without a code: invalid argument
  EXPECT_EQ(Error(ErrorCode::IO, "x").code(), ErrorCode::IO);
  expect_code([] { check(false, "m1"); }, ErrorCode::InvalidArgument, "m1");
  expect_code([] { check(false, ErrorCode::Format, "m2"); }, ErrorCode::Format, "m2");
  EXPECT_NO_THROW(check(true, ErrorCode::Internal, "never"));
  EXPECT_EQ(NonFiniteError("v", 0, -1).code(), ErrorCode::NonFinite);
  std::set<std::string> names;
  for (int c = 0; c <= static_cast<int>(ErrorCode::Internal); ++c)
    names.insert(error_code_name(static_cast<ErrorCode>(c)));
  EXPECT_EQ(names.size(), 8u);
  EXPECT_EQ(names.count("unknown error"), 0u);
}

TEST(Errors, MissingOrUnreadablePathsAreIO) {
  TempDir dir;
  expect_code([&] { Checkpoint::open(dir / "nope"); }, ErrorCode::IO, "checkpoint directory not found");
  std::filesystem::create_directories(dir / "empty");
  expect_code([&] { Checkpoint::open(dir / "empty"); }, ErrorCode::IO, "config.json: missing");
  Files f;
  expect_code([&] { Checkpoint::open(f.ck, dir / "no-vlm.json"); }, ErrorCode::IO, "no-vlm.json: cannot open");
  std::filesystem::remove(f.ck + "/model.safetensors");
  expect_code([&] { Checkpoint::open(f.ck); }, ErrorCode::IO, "no model.safetensors");
  expect_code([&] { Context::open(dir / "none.safetensors"); }, ErrorCode::IO, "none.safetensors: cannot open");
  expect_code([&] { Context::open(dir.path().string()); }, ErrorCode::IO, "is a directory, expected a regular file");
  OutputSet out;
  expect_code([&] { out.add(dir / "no-dir/out.safetensors", "--out"); }, ErrorCode::IO, "does not exist");
}

TEST(Errors, MalformedFilesAreFormat) {
  Files f;
  const std::string cfg = f.ck + "/config.json", st = f.ck + "/model.safetensors";
  const std::string good_cfg = read_text(cfg), good_st = read_text(st);
  write_text(cfg, "{");
  expect_code([&] { Checkpoint::open(f.ck); }, ErrorCode::Format, "invalid JSON");
  write_text(cfg, good_cfg);
  write_text(st, good_st.substr(0, good_st.size() / 2));
  expect_code([&] { Checkpoint::open(f.ck); }, ErrorCode::Format, "out of range");
  write_text(st, "this is not a safetensors file");
  expect_code([&] { Checkpoint::open(f.ck); }, ErrorCode::Format, "not a safetensors file");
  write_text(st, good_st);
  EXPECT_NO_THROW(Checkpoint::open(f.ck));

  write_text(f.ctx + ".bad", "{}");
  expect_code([&] { Context::open(f.ctx + ".bad"); }, ErrorCode::Format, "truncated safetensors file");
  // A value out of range in a file is a format error; the same value from the caller an invalid argument.
  TensorSet t = TensorSet::read(f.ctx);
  ASSERT_EQ(t.t["valid_len"].dtype, DType::I64);
  reinterpret_cast<int64_t*>(t.t["valid_len"].bytes.data())[0] = 33;
  t.write(f.ctx + ".len");
  expect_code([&] { Context::open(f.ctx + ".len"); }, ErrorCode::Format, "valid_len[0] = 33 is outside [0, P = 32]");
  const Context good = Context::open(f.ctx);
  KVCache kv = good.kv();
  kv.valid_len[0] = 33;
  expect_code([&] { Context::from_views(kv, good.rope_delta(), good.history(), good.v0()); },
              ErrorCode::InvalidArgument, "valid_len[0] = 33 is outside [0, P = 32]");
}

TEST(Errors, WhatTheEngineDoesNotRunIsUnsupported) {
  Files f;
  auto ck = Checkpoint::open(f.ck);
  expect_code([&] { Model::load(ck, "no-such-backend"); }, ErrorCode::Unsupported, "unknown backend 'no-such-backend'");
  BackendOptions o;
  o.weights = "fp4";
  expect_code([&] { Model::load(ck, "reference", o); }, ErrorCode::Unsupported, "unknown weight format 'fp4'");
  o = {};
  o.kernels = "attention=avx9000";
  expect_code([&] { Model::load(ck, "reference", o); }, ErrorCode::Unsupported, "no kernels to choose");
  const std::string cfg = f.ck + "/config.json";
  std::string text = read_text(cfg);
  const size_t at = text.find("\"euler\"");
  ASSERT_NE(at, std::string::npos) << text;
  write_text(cfg, text.replace(at, 7, "\"heun\""));
  expect_code([&] { Checkpoint::open(f.ck); }, ErrorCode::Unsupported, "integrate with euler only");

  // Memory the backend cannot read: a cache said to live on a CUDA device, bound to a host backend.
  const Context host = Context::open(f.ctx);
  KVCache kv = host.kv();
  for (auto* list : {&kv.key, &kv.value})
    for (TensorView& v : *list) v.device = {DeviceType::CUDA, 0};
  Session s(Model::load(ck, "reference"));
  expect_code([&] { s.bind(Context::from_views(kv, host.rope_delta(), host.history(), host.v0())); },
              ErrorCode::Unsupported, "memory, which the reference backend cannot read");
  EXPECT_FALSE(s.bound());
}

TEST(Errors, NonFiniteValuesAreNonFinite) {
  Files f;
  auto ck = Checkpoint::open(f.ck);
  Session s(Model::load(ck, "reference"));
  s.bind(Context::open(f.ctx));
  SampleOptions o;
  o.steps = 1;
  o.noise.assign(size_t(ck->config().T) * ck->config().A, 0.f);
  o.noise[3] = NAN;
  expect_code([&] { s.sample(o); }, ErrorCode::NonFinite, "noise: non-finite value");
  o.noise.clear();
  o.v0 = NAN;  // an option, not an input tensor: an invalid argument
  expect_code([&] { s.sample(o); }, ErrorCode::InvalidArgument, "v0 must be finite");

  TensorSet t = TensorSet::read(f.ctx);
  ASSERT_EQ(t.t["key.1"].dtype, DType::BF16);
  reinterpret_cast<uint16_t*>(t.t["key.1"].bytes.data())[5] = 0x7fc0;  // NaN in row 0, which sample 0 attends to
  t.write(f.ctx + ".nan");
  expect_code([&] { Context::open(f.ctx + ".nan"); }, ErrorCode::NonFinite, "key.1: non-finite value at [0, 0, 0, 5]");

  TensorSet w = TensorSet::read(f.ck + "/model.safetensors");
  const std::string key = "expert.expert.layers.0.mlp.down_proj.weight";
  ASSERT_TRUE(w.t.count(key));
  reinterpret_cast<uint16_t*>(w.t[key].bytes.data())[0] = 0x7f80;  // +Inf
  w.write(f.ck + "/model.safetensors");
  expect_code([&] { Model::load(Checkpoint::open(f.ck), "reference"); }, ErrorCode::NonFinite, "non-finite value inf");
}

TEST(Errors, AMemoryLimitIsOutOfMemory) {
  Files f;
  auto ck = Checkpoint::open(f.ck);
  {
    ScopedEnv limit("ALPAMAYO_MEMORY_LIMIT", "1K");
    expect_code([&] { Model::load(ck, "reference"); }, ErrorCode::OutOfMemory, "only 1.00 KiB is available");
  }
  Session s(Model::load(ck, "reference"));
  ScopedEnv limit("ALPAMAYO_MEMORY_LIMIT", "1K");
  expect_code([&] { s.bind(Context::open(f.ctx)); }, ErrorCode::OutOfMemory, "only 1.00 KiB is available");
  limit.set("lots");  // a malformed setting is an invalid argument, not a shortage
  expect_code([&] { s.bind(Context::open(f.ctx)); }, ErrorCode::InvalidArgument, "ALPAMAYO_MEMORY_LIMIT = 'lots'");
}

TEST(Errors, CallsOutOfOrderAreInvalidState) {
  Files f;
  Session s(Model::load(Checkpoint::open(f.ck), "reference"));
  expect_code([&] { s.sample({}); }, ErrorCode::InvalidState, "no context bound");
  expect_code([&] { s.context(); }, ErrorCode::InvalidState, "no context bound");
}

}  // namespace
}  // namespace alpamayo
