// Issue 7, classes 5-7 at the library level: bounded sizes, memory estimated before allocating, the v0 fit in
// linear time (bitwise the dense solve), non-finite values named by stage and tensor, bad_alloc named by stage.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include "alpamayo/action_space.h"
#include "alpamayo/engine.h"
#include "alpamayo/limits.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using namespace test;  // expect_error, TempDir, TensorSet, tiny_spec

// The dense normal-equation solve estimate_v0 used before (O(H^2) memory, O(H^3) time), kept as the oracle.
double dense_v0(const float* xyz, const float* rot, int n, const ExpertConfig& c) {
  const double dt = c.dt;
  std::vector<double> raw(n), yaw(n);
  for (int i = 0; i < n; ++i) raw[i] = std::atan2(rot[9 * i + 3], rot[9 * i + 0]);
  yaw[0] = raw[0];
  for (int i = 1; i < n; ++i) {
    const double dy = raw[i] - raw[i - 1];
    yaw[i] = yaw[i - 1] + std::atan2(std::sin(dy), std::cos(dy));
  }
  std::vector<double> M(int64_t(n) * n, 0.0), rhs(n, 0.0);
  for (int i = 0; i + 1 < n; ++i) {
    const double g[2] = {2.0 / dt * (xyz[3 * (i + 1)] - xyz[3 * i]), 2.0 / dt * (xyz[3 * (i + 1) + 1] - xyz[3 * i + 1])};
    const double u0[2] = {std::cos(yaw[i]), std::sin(yaw[i])}, u1[2] = {std::cos(yaw[i + 1]), std::sin(yaw[i + 1])};
    for (int r = 0; r < 2; ++r) {
      M[int64_t(i) * n + i] += u0[r] * u0[r];
      M[int64_t(i) * n + i + 1] += u0[r] * u1[r];
      M[int64_t(i + 1) * n + i] += u1[r] * u0[r];
      M[int64_t(i + 1) * n + i + 1] += u1[r] * u1[r];
      rhs[i] += u0[r] * g[r];
      rhs[i + 1] += u1[r] * g[r];
    }
  }
  const double lam = c.v_lambda / std::pow(dt, 6);
  const double d3[4] = {-1.0, 3.0, -3.0, 1.0};
  for (int r = 0; r + 3 < n; ++r)
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) M[int64_t(r + a) * n + r + b] += lam * d3[a] * d3[b];
  for (int i = 0; i < n; ++i) M[int64_t(i) * n + i] += c.v_ridge;
  for (int j = 0; j < n; ++j) {
    double s = M[int64_t(j) * n + j];
    for (int k = 0; k < j; ++k) s -= M[int64_t(j) * n + k] * M[int64_t(j) * n + k];
    const double ljj = std::sqrt(s);
    M[int64_t(j) * n + j] = ljj;
    for (int i = j + 1; i < n; ++i) {
      double t = M[int64_t(i) * n + j];
      for (int k = 0; k < j; ++k) t -= M[int64_t(i) * n + k] * M[int64_t(j) * n + k];
      M[int64_t(i) * n + j] = t / ljj;
    }
  }
  std::vector<double> y(n);
  for (int i = 0; i < n; ++i) {
    double t = rhs[i];
    for (int k = 0; k < i; ++k) t -= M[int64_t(i) * n + k] * y[k];
    y[i] = t / M[int64_t(i) * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {
    double t = y[i];
    for (int k = i + 1; k < n; ++k) t -= M[int64_t(k) * n + i] * y[k];
    y[i] = t / M[int64_t(i) * n + i];
  }
  return y[n - 1];
}

// A curving, accelerating history with noise: H poses ending at the origin.
void history(int H, uint64_t seed, std::vector<float>* xyz, std::vector<float>* rot) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.02);
  xyz->assign(size_t(H) * 3, 0.f);
  rot->assign(size_t(H) * 9, 0.f);
  double x = 0, y = 0, th = 0.3, v = 8.0;
  for (int i = 0; i < H; ++i) {
    (*xyz)[3 * i] = static_cast<float>(x + noise(rng));
    (*xyz)[3 * i + 1] = static_cast<float>(y + noise(rng));
    float* R = rot->data() + 9 * i;
    R[0] = static_cast<float>(std::cos(th));
    R[1] = static_cast<float>(-std::sin(th));
    R[3] = static_cast<float>(std::sin(th));
    R[4] = static_cast<float>(std::cos(th));
    R[8] = 1.f;
    x += 0.1 * v * std::cos(th);
    y += 0.1 * v * std::sin(th);
    th += 0.01 + 0.002 * std::sin(i * 0.1);
    v += 0.05;
  }
}

TEST(V0Fit, BandedSolveIsBitwiseTheDenseSolve) {
  ExpertConfig c;
  for (int H : {2, 3, 4, 5, 6, 17, 64, 300}) {
    for (uint64_t seed : {1u, 2u}) {
      std::vector<float> xyz, rot;
      history(H, seed, &xyz, &rot);
      const double banded = estimate_v0(xyz.data(), rot.data(), H, c);
      const double dense = dense_v0(xyz.data(), rot.data(), H, c);
      EXPECT_EQ(banded, dense) << "H = " << H << " seed " << seed;  // bitwise, not approximately
      EXPECT_TRUE(std::isfinite(banded));
    }
  }
}

TEST(V0Fit, LongHistoryIsLinearTime) {
  ExpertConfig c;
  std::vector<float> xyz, rot;
  const int H = 200000;  // dense: 320 GB and hours; banded: a few MB and milliseconds
  history(H, 3, &xyz, &rot);
  const auto t0 = std::chrono::steady_clock::now();
  const double v = estimate_v0(xyz.data(), rot.data(), H, c);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(std::isfinite(v));
  EXPECT_LT(s, 2.0);
}

TEST(Limits, CheckRangeNamesValueAndBound) {
  EXPECT_NO_THROW(check_range(5, 1, 10, "x"));
  expect_error([] { check_range(11, 1, 10, "config.json: 'n'"); }, {"config.json: 'n' = 11", "outside [1, 10]"});
  expect_error([] { check_range(NAN, 1, 10, "v0"); }, {"v0 must be finite", "nan"});
  expect_error([] { check_range(-INFINITY, -1, 1, "dt"); }, {"dt must be finite", "-inf"});
}

TEST(Limits, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 bytes");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3.0 * (1ull << 30)), "3.00 GiB");
}

struct EnvVar {
  EnvVar(const char* k, const char* v) : k_(k) { setenv(k, v, 1); }
  ~EnvVar() { unsetenv(k_); }
  const char* k_;
};

TEST(Limits, MemoryAvailableHonoursTheOverride) {
  std::string src;
  {
    EnvVar e("ALPAMAYO_MEMORY_LIMIT", "2M");
    EXPECT_EQ(available_memory_bytes(&src), 2.0 * 1024 * 1024);
    EXPECT_EQ(src, "ALPAMAYO_MEMORY_LIMIT");
  }
  {
    EnvVar e("ALPAMAYO_MEMORY_LIMIT", "lots");
    expect_error([] { available_memory_bytes(); }, {"ALPAMAYO_MEMORY_LIMIT", "'lots'"});
  }
  const double a = available_memory_bytes(&src);
  EXPECT_GT(a, 0);  // /proc/meminfo on Linux
  EXPECT_FALSE(src.empty());
}

TEST(Limits, ModelAndSessionRefusedBeforeAllocatingWhenMemoryIsShort) {
  TempDir dir;
  write_synthetic_checkpoint(dir / "ck", tiny_spec());
  auto ck = Checkpoint::open(dir / "ck");
  SyntheticContextSpec cs;
  cs.P = 64;
  write_synthetic_context(dir / "ctx.safetensors", ck->config(), cs);
  for (const std::string& be : backend_names()) {
    if (!find_backend(be).unavailable().empty()) continue;  // a GPU backend without a GPU
    {
      EnvVar e("ALPAMAYO_MEMORY_LIMIT", "1K");
      expect_error([&] { Model::load(ck, be); }, {"loading the model", be, "needs about", "only 1.00 KiB is available"});
    }
    auto model = Model::load(ck, be);
    Session s(model);
    {
      EnvVar e("ALPAMAYO_MEMORY_LIMIT", "1K");
      expect_error([&] { s.bind(Context::open(dir / "ctx.safetensors")); },
                   {"binding", "ctx.safetensors", "activations over B*T = 8 rows", "only 1.00 KiB"});
      EXPECT_FALSE(s.bound());
    }
    const MemoryEstimate m = estimate_model_memory(ck->config(), be, model->weights());
    if (find_backend(be).memory.host_bytes_per_weight) {  // a backend holding its weights in host memory
      EXPECT_GE(m.bytes, double(model->backend().weight_bytes()) * 0.5) << be << ": " << m.parts;
    }
  }
}

TEST(Limits, StageSurvivesUnwindingForTheBoundary) {
  try {
    const StageScope outer("opening the checkpoint x");
    const StageScope inner("loading the model into the cpu backend");
    throw std::bad_alloc();
  } catch (const std::bad_alloc&) {
    const std::string m = out_of_memory_message();
    EXPECT_NE(m.find("out of memory while loading the model into the cpu backend"), std::string::npos) << m;
    EXPECT_NE(m.find("available now"), std::string::npos) << m;
  }
  { const StageScope next("something else"); }  // a new outermost stage clears the record
  EXPECT_EQ(current_stage(), "");
}

// ---- the checkpoint's sizes and values
TEST(Limits, HiddenSizeZeroIsRefusedNamingTheTensor) {
  TempDir dir;
  write_synthetic_checkpoint(dir / "ck", tiny_spec());
  ExpertConfig c = Checkpoint::open(dir / "ck")->config();
  ModelWeights w = Checkpoint::open(dir / "ck")->weights();
  c.D = 0;
  expect_error([&] { validate_weights(c, w); }, {"every size must be positive", "D=0"});
  c = Checkpoint::open(dir / "ck")->config();
  c.I = int(limits::kMaxMlp) + 1;
  expect_error([&] { validate_weights(c, w); }, {"MLP width I", "beyond the bound"});
  c = Checkpoint::open(dir / "ck")->config();
  c.dt = 1e300;
  expect_error([&] { validate_weights(c, w); }, {"dt", "outside [0.0001, 100]"});
}

TEST(Limits, NonFiniteWeightIsNamedAtLoad) {
  TempDir dir;
  write_synthetic_checkpoint(dir / "ck", tiny_spec());
  const std::string f = dir / "ck/model.safetensors";
  TensorSet t = TensorSet::read(f);
  const std::string key = "expert.expert.layers.1.self_attn.k_proj.weight";
  ASSERT_TRUE(t.t.count(key));
  ASSERT_EQ(t.t[key].dtype, DType::BF16);
  reinterpret_cast<uint16_t*>(t.t[key].bytes.data())[3 * 64 + 7] = 0x7fc0;  // NaN at [3, 7]
  t.write(f);
  auto ck = Checkpoint::open(dir / "ck");
  for (const std::string& be : backend_names())
    if (be != "cuda") expect_error([&] { Model::load(ck, be); }, {key, "non-finite value nan at [3, 7]"});
}

TEST(Limits, OverflowIsTracedToTheLayerAndTheTensor) {
  TempDir dir;
  write_synthetic_checkpoint(dir / "ck", tiny_spec());
  const std::string f = dir / "ck/model.safetensors";
  TensorSet t = TensorSet::read(f);
  const std::string key = "expert.expert.layers.1.mlp.up_proj.weight";
  auto* u = reinterpret_cast<uint16_t*>(t.t[key].bytes.data());
  for (size_t i = 0; i < t.t[key].bytes.size() / 2; ++i) u[i] = 0x7f7f;  // 3.39e38, finite
  t.write(f);
  auto ck = Checkpoint::open(dir / "ck");
  SyntheticContextSpec cs;
  cs.P = 32;
  write_synthetic_context(dir / "ctx.safetensors", ck->config(), cs);
  int traced = 0;
  for (const BackendInfo& info : registered_backends()) {
    if (!info.features.traces_non_finite || !info.unavailable().empty()) continue;  // declared per backend
    ++traced;
    const std::string& be = info.name;
    Session s(Model::load(ck, be));
    s.bind(Context::open(dir / "ctx.safetensors"));
    SampleOptions o;
    o.steps = 2;
    expect_error([&] { s.sample(o); }, {"layer 1 output of Euler step 0", "is non-finite at [sample 0",
                                        "its input (layer 0 output) is finite",
                                        "inside layer 1 the first non-finite output is mlp.up_proj",
                                        "mlp.up_proj.weight", "3.39e+38"});
  }
  EXPECT_GT(traced, 0) << "the reference backend traces non-finite values";
}

TEST(Limits, NonFiniteAtInputsIsNamedUpFront) {
  TempDir dir;
  write_synthetic_checkpoint(dir / "ck", tiny_spec());
  auto ck = Checkpoint::open(dir / "ck");
  SyntheticContextSpec cs;
  cs.P = 32;
  write_synthetic_context(dir / "ctx.safetensors", ck->config(), cs);
  Session s(Model::load(ck, "reference"));
  s.bind(Context::open(dir / "ctx.safetensors"));
  SampleOptions o;
  o.steps = 1;
  o.noise.assign(size_t(ck->config().T) * 2, 0.f);
  o.noise[5] = NAN;
  expect_error([&] { s.sample(o); }, {"noise", "non-finite", "flat index 5"});
  o.noise.clear();
  o.v0 = 1e39;
  expect_error([&] { s.sample(o); }, {"v0 = 1e+39", "outside [-1000, 1000] m/s"});
  o.v0 = NAN;
  expect_error([&] { s.sample(o); }, {"v0 must be finite"});
  o.v0.reset();
  o.temperature = INFINITY;
  expect_error([&] { s.sample(o); }, {"temperature must be finite"});
}

TEST(Limits, TrajectoryDecodeOverflowIsNamed) {
  // Finite actions with a huge speed and statistics still overflow in the unicycle decode: named, not written.
  ExpertConfig c;
  c.T = 4;
  c.accel_std = 1e3;
  c.dt = 100;
  std::vector<float> a(8, 3e38f);
  const Trajectory tr = decode_action(a.data(), c.T, 1e3, 0, c);
  bool finite = true;
  for (float v : tr.xyz) finite = finite && std::isfinite(v);
  EXPECT_FALSE(finite);  // the session checks this (Session::sample: "trajectory decode: ...")
}

}  // namespace
}  // namespace alpamayo
