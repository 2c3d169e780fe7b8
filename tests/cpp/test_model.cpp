// Host-side pieces: Fourier features, rope tables, the time grid, noise, sampler and action decode.
#include <cmath>
#include <cstring>
#include <random>

#include "alpamayo/action_space.h"
#include "alpamayo/engine.h"
#include "backends/kv_int8.h"
#include "backends/reference/ops.h"
#include "model/fourier.h"
#include "model/sampler.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::expect_error;
using test::TempDir;
using test::tiny_spec;

TEST(Fourier, FrequenciesMatchTorchLogspaceAndBf16Rounding) {
  // torch.logspace(0, 2, 10) and its bf16 rounding (the release's buffers).
  const std::vector<float> exact = {1.0f, 1.6681005954742432f, 2.782559394836426f, 4.6415886878967285f,
                                    7.742636680603027f, 12.915496826171875f, 21.544347763061523f,
                                    35.93813705444336f, 59.94842529296875f, 100.0f};
  const std::vector<float> rounded = {1.0f, 1.671875f, 2.78125f, 4.65625f, 7.75f, 12.9375f, 21.5f, 36.0f, 60.0f, 100.0f};
  const auto e = fourier_freqs(20, 100.0, false), r = fourier_freqs(20, 100.0, true);
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(e[i], exact[i], exact[i] * 2e-7) << i;
    EXPECT_EQ(r[i], rounded[i]) << i;
  }
}

TEST(Fourier, FeaturesAreScaledSinCos) {
  const std::vector<float> f = {1.f, 2.5f};
  float out[4];
  fourier_features(0.3f, f, out);
  for (int j = 0; j < 2; ++j) {
    EXPECT_NEAR(out[j], std::sqrt(2.0) * std::sin(2 * M_PI * f[j] * 0.3), 1e-5);
    EXPECT_NEAR(out[2 + j], std::sqrt(2.0) * std::cos(2 * M_PI * f[j] * 0.3), 1e-5);
  }
}

TEST(Rope, InvFreqMatchesTransformersBitForBit) {
  const auto inv = rope_inv_freq(128, 5e6);
  EXPECT_EQ(inv[0], 1.0f);
  EXPECT_EQ(inv[1], 0x1.92585p-1f);
  EXPECT_EQ(inv[17], 0x1.10461ep-6f);
  EXPECT_EQ(inv[63], 0x1.11469ep-22f);
}

TEST(Rope, TablesUsePositionsFromValidLengthAndDelta) {
  const RopeTables r = make_rope_tables({4700, 10}, {5, -20}, 3, 128, 5e6);
  ASSERT_EQ(r.cos.size(), 2u * 3 * 128);
  // sample 0, token 0: position 4705 (torch: angle 0x1.ce2a92p+11, cos -0x1.e552ap-1 for j = 1)
  EXPECT_EQ(r.cos[1], -0x1.e552ap-1f);
  EXPECT_EQ(r.cos[1], r.cos[64 + 1]);  // duplicated halves
  // sample 1, token 2: position 2 + (-20) + 10 = -8 (negative positions are allowed)
  const auto inv = rope_inv_freq(128, 5e6);
  const float* s = r.sin.data() + (1 * 3 + 2) * 128;
  for (int j = 0; j < 64; ++j) EXPECT_FLOAT_EQ(s[j], std::sin(-8.0f * inv[j]));
}

TEST(Sampler, TimeGridMatchesTorchLinspaceBitForBit) {
  const auto t = euler_time_grid(10);
  const std::vector<float> torch_grid = {0x0p+0f, 0x1.99999ap-4f, 0x1.99999ap-3f, 0x1.333334p-2f, 0x1.99999ap-2f, 0x1p-1f,
                                         0x1.333334p-1f, 0x1.666666p-1f, 0x1.99999ap-1f, 0x1.ccccccp-1f, 0x1p+0f};
  EXPECT_EQ(t, torch_grid);
  EXPECT_EQ(euler_time_grid(1), (std::vector<float>{0.f, 1.f}));
}

TEST(Sampler, NoiseIsSeededStandardNormalAndPrefixStable) {
  const auto a = gaussian_noise(7, 200001), b = gaussian_noise(7, 64), c = gaussian_noise(8, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(a[i], b[i]);
  EXPECT_NE(b, c);
  double m = 0, v = 0;
  for (float x : a) m += x;
  m /= a.size();
  for (float x : a) v += (x - m) * (x - m);
  v /= a.size();
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.01);
}

ExpertConfig unit_action_cfg() {
  ExpertConfig c;
  c.dt = 0.1;
  return c;  // means 0, stds 1
}

TEST(ActionSpace, StraightLineAndCircle) {
  ExpertConfig c = unit_action_cfg();
  std::vector<float> zero(2 * 64, 0.f);
  Trajectory tr = decode_action(zero.data(), 64, 10.0, 1.5, c);
  for (int k = 0; k < 64; ++k) {
    EXPECT_NEAR(tr.xyz[3 * k], 10.0 * 0.1 * (k + 1), 1e-4);
    EXPECT_NEAR(tr.xyz[3 * k + 1], 0.0, 1e-6);
    EXPECT_FLOAT_EQ(tr.xyz[3 * k + 2], 1.5f);
  }
  // Constant curvature at constant speed: yaw grows by kappa v dt per step, and the points lie near a
  // circle of radius 1/kappa centred at (0, 1/kappa) (trapezoid chords: second-order error).
  std::vector<float> turn(2 * 64);
  for (int k = 0; k < 64; ++k) { turn[2 * k] = 0.f; turn[2 * k + 1] = 0.05f; }
  tr = decode_action(turn.data(), 64, 10.0, 0.0, c);
  for (int k = 0; k < 64; ++k) {
    EXPECT_NEAR(tr.yaw[k], 0.05 * 10.0 * 0.1 * (k + 1), 1e-5);
    const double dx = tr.xyz[3 * k], dy = tr.xyz[3 * k + 1] - 20.0;
    EXPECT_NEAR(std::sqrt(dx * dx + dy * dy), 20.0, 0.05);
    const float* R = tr.rot.data() + 9 * k;
    EXPECT_NEAR(R[0], std::cos(tr.yaw[k]), 1e-6);
    EXPECT_NEAR(R[3], std::sin(tr.yaw[k]), 1e-6);
    EXPECT_NEAR(R[1], -std::sin(tr.yaw[k]), 1e-6);
    EXPECT_EQ(R[8], 1.f);
  }
  // Acceleration: v grows by a dt; x = v0 t + a t^2 / 2 exactly under the trapezoid rule.
  std::vector<float> acc(2 * 8);
  for (int k = 0; k < 8; ++k) { acc[2 * k] = 2.f; acc[2 * k + 1] = 0.f; }
  tr = decode_action(acc.data(), 8, 1.0, 0.0, c);
  for (int k = 0; k < 8; ++k) {
    const double t = 0.1 * (k + 1);
    EXPECT_NEAR(tr.xyz[3 * k], 1.0 * t + t * t, 1e-5);
  }
}

TEST(ActionSpace, DenormalizesWithConfigStatistics) {
  ExpertConfig c = unit_action_cfg();
  c.accel_mean = 1.0;
  c.accel_std = 2.0;
  std::vector<float> a(2 * 4, 0.f);
  a[0] = 0.5f;  // a_0 = 0.5 * 2 + 1 = 2
  Trajectory tr = decode_action(a.data(), 4, 0.0, 0.0, c);
  // v_1 = 0.2, later steps a = 1: v_2 = 0.3 ...; x_1 = dt/2 (0 + 0.2)
  EXPECT_NEAR(tr.xyz[0], 0.05 * 0.2, 1e-7);
  EXPECT_NEAR(tr.xyz[3], 0.05 * 0.2 + 0.05 * (0.2 + 0.3), 1e-7);
}

// History of H poses at constant speed on an arc of curvature kappa, ending at the origin heading 0.
void arc_history(double speed, double kappa, int H, double dt, std::vector<float>& xyz, std::vector<float>& rot) {
  for (int i = 0; i < H; ++i) {
    const double s = -speed * dt * (H - 1 - i), th = kappa * s;
    const double x = kappa != 0 ? std::sin(th) / kappa : s, y = kappa != 0 ? (1 - std::cos(th)) / kappa : 0;
    xyz.insert(xyz.end(), {float(x), float(y), 0.f});
    rot.insert(rot.end(), {float(std::cos(th)), float(-std::sin(th)), 0, float(std::sin(th)), float(std::cos(th)), 0, 0, 0, 1});
  }
}

TEST(ActionSpace, V0FromHistory) {
  const ExpertConfig c = unit_action_cfg();
  for (double kappa : {0.0, 0.02, -0.1}) {
    std::vector<float> xyz, rot;
    arc_history(12.5, kappa, 16, c.dt, xyz, rot);
    EXPECT_NEAR(estimate_v0(xyz.data(), rot.data(), 16, c), 12.5, 0.02) << kappa;
  }
  // Uniform acceleration: v0 is the speed at the last pose.
  std::vector<float> xyz, rot;
  for (int i = 0; i < 20; ++i) {
    const double t = -0.1 * (19 - i), x = 10 * t + 0.5 * 1.0 * t * t;
    xyz.insert(xyz.end(), {float(x), 0.f, 0.f});
    rot.insert(rot.end(), {1, 0, 0, 0, 1, 0, 0, 0, 1});
  }
  EXPECT_NEAR(estimate_v0(xyz.data(), rot.data(), 20, c), 10.0, 0.02);
  // Yaw unwrapping across +-pi: heading pi (driving in -x) crossing the branch cut.
  xyz.clear();
  rot.clear();
  for (int i = 0; i < 10; ++i) {
    const double th = M_PI + (i % 2 ? 1e-3 : -1e-3);
    xyz.insert(xyz.end(), {float(-5.0 * 0.1 * i), 0.f, 0.f});
    rot.insert(rot.end(), {float(std::cos(th)), float(-std::sin(th)), 0, float(std::sin(th)), float(std::cos(th)), 0, 0, 0, 1});
  }
  EXPECT_NEAR(estimate_v0(xyz.data(), rot.data(), 10, c), 5.0, 0.02);
  expect_error([&] { estimate_v0(xyz.data(), rot.data(), 1, c); }, {"at least 2"});
}

TEST(Sampler, EulerStepsAreConsistentAndNoiseIsChecked) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", tiny_spec());
  auto ck = Checkpoint::open(tmp / "ck");
  SyntheticContextSpec cs;
  cs.B = 2;
  cs.P = 12;
  cs.valid_len = {12, 5};
  cs.rope_delta = {0, -3};
  write_synthetic_context(tmp / "ctx", ck->config(), cs);
  Session eng(Model::load(ck, "reference"));
  eng.bind(Context::open(tmp / "ctx"));
  SampleOptions o;
  o.steps = 4;
  o.all_steps = true;
  o.seed = 3;
  const SampleResult r = eng.sample(o);
  const int64_t n = 2 * 8 * 2;
  ASSERT_EQ(r.x_steps.size(), size_t(5 * n));
  ASSERT_EQ(r.v_steps.size(), size_t(4 * n));
  EXPECT_EQ(std::vector<float>(r.x_steps.begin(), r.x_steps.begin() + n), gaussian_noise(3, n));
  const auto t = euler_time_grid(4);
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(r.x_steps[(k + 1) * n + i], r.x_steps[k * n + i] + (t[k + 1] - t[k]) * r.v_steps[k * n + i]);
  EXPECT_EQ(std::vector<float>(r.x_steps.end() - n, r.x_steps.end()), r.action);
  EXPECT_EQ(r.v0_source, "ego history");
  // The same seed reproduces the sample; a NaN or a wrongly sized noise is rejected.
  EXPECT_EQ(eng.sample(o).action, r.action);
  o.noise.assign(n, 0.f);
  o.noise[5] = NAN;
  expect_error([&] { eng.sample(o); }, {"noise", "non-finite"});
  o.noise.assign(n - 1, 0.f);
  expect_error([&] { eng.sample(o); }, {"noise", std::to_string(n)});
}

// The int8 KV cache's row quantisation (src/backends/kv_int8.h), which the reference applies to every attended
// key and value row (ref::round_rows_s8) and the cpu backend stores.
TEST(KvInt8, ZeroRowHasScaleZero) {
  const std::vector<float> x(16, 0.f);
  std::vector<int8_t> q(16, 5);
  EXPECT_EQ(quantize_row_s8(x.data(), 16, q.data()), 0.f);
  EXPECT_EQ(q, std::vector<int8_t>(16, 0));
  std::vector<float> back(16, 1.f);
  dequantize_row_s8(q.data(), 0.f, 16, back.data());
  EXPECT_EQ(back, x);
  const std::vector<float> negzero(4, -0.f);
  EXPECT_EQ(quantize_row_s8(negzero.data(), 4, q.data()), 0.f);
  EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 4), std::vector<int8_t>(4, 0));
}

TEST(KvInt8, MaxMapsTo127AndTiesRoundToEven) {
  // a = 127: the multiplier 127 / a is exactly 1, so x * inv = x and the halves are exact ties.
  const std::vector<float> x = {127.f, 0.5f, 1.5f, 2.5f, 3.5f, -0.5f, -2.5f, 126.5f, -126.5f, 0.49999997f, -3.f};
  std::vector<int8_t> q(x.size());
  EXPECT_EQ(quantize_row_s8(x.data(), static_cast<int>(x.size()), q.data()), 1.f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, 0, 2, 2, 4, 0, -2, 126, -126, 0, -3}));
  // The largest magnitude maps to +-127 with s = a / 127, whatever its sign.
  const std::vector<float> y = {-3.f, 1.f, 2.f};
  std::vector<int8_t> r(3);
  EXPECT_EQ(quantize_row_s8(y.data(), 3, r.data()), 3.f / 127.f);
  EXPECT_EQ(r, (std::vector<int8_t>{-127, 42, 85}));
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int t = 0; t < 200; ++t) {
    std::vector<float> z(64);
    for (float& v : z) v = n(rng) * std::ldexp(1.f, t % 20 - 10);
    std::vector<int8_t> qz(64);
    const float s = quantize_row_s8(z.data(), 64, qz.data());
    int peak = 0;
    for (int c = 0; c < 64; ++c) {
      peak = std::max(peak, std::abs(int(qz[c])));
      EXPECT_LE(std::fabs(z[c] - qz[c] * s), 0.5f * s * (1 + 1e-4f)) << t << " " << c;  // round to nearest
    }
    EXPECT_EQ(peak, 127) << t;
  }
}

TEST(KvInt8, RequantisingIsIdempotent) {
  // x^ = q * s quantises again to the same q, and to a scale within one ulp of s.
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int t = 0; t < 500; ++t) {
    const int d = 16 << (t % 4);
    std::vector<float> x(d), xh(d);
    for (float& v : x) v = n(rng) * std::ldexp(1.f, t % 24 - 12);
    std::vector<int8_t> q(d), q2(d);
    const float s = quantize_row_s8(x.data(), d, q.data());
    dequantize_row_s8(q.data(), s, d, xh.data());
    const float s2 = quantize_row_s8(xh.data(), d, q2.data());
    EXPECT_EQ(q2, q) << t;
    EXPECT_LE(std::fabs(s2 - s), std::nextafter(s, INFINITY) - s) << t;
  }
}

TEST(KvInt8, ReferenceRoundsEveryFiniteRow) {
  // ref::round_rows_s8 (what the reference applies to each attended row) is quantise then dequantise, row by
  // row; a row with a non-finite value is left as it is.
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 2.f);
  const int rows = 5, d = 24;
  std::vector<float> x(rows * d);
  for (float& v : x) v = n(rng);
  x[3 * d + 7] = NAN;
  std::vector<float> y = x;
  ref::round_rows_s8(y.data(), rows, d);
  for (int r = 0; r < rows; ++r) {
    std::vector<int8_t> q(d);
    std::vector<float> want(d);
    dequantize_row_s8(q.data(), quantize_row_s8(x.data() + r * d, d, q.data()), d, want.data());
    for (int c = 0; c < d; ++c) {
      if (r == 3)
        EXPECT_TRUE(std::memcmp(&y[r * d + c], &x[r * d + c], 4) == 0) << c;
      else
        EXPECT_EQ(y[r * d + c], want[c]) << r << " " << c;
    }
  }
  EXPECT_NE(y[0], x[0]);  // N(0, 2) values are not multiples of a / 127
}

}  // namespace
}  // namespace alpamayo
