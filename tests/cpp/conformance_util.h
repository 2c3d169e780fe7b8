// What the conformance suite compares and how (tests/cpp/test_conformance.cpp): the table of shapes, random
// problems held in memory, the targets (every registered backend x weight format), the comparison statistics
// and the tolerances of each weight format. Shared with the cuda backend's emulated run
// (tests/cpp/test_cuda_emulated.cpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/error.h"
#include "model/fourier.h"

namespace alpamayo::conformance {

// How a context's cache rows are laid out (docs/FORMATS.md): G = S.size() prompts of P rows with S[g] rows
// in use, of which the first pad[g] are left padding; B samples (rope_delta.size()), sample b reading
// prompt prompt_of[b] (default b) and suffix rows [0, suffix[b]) of a [B, Hkv, Q, d] suffix cache.
struct CtxSpec {
  int P;
  std::vector<int64_t> S, rope_delta;
  std::vector<int64_t> prompt_of{}, pad{};
  int Q = 0;
  std::vector<int64_t> suffix{};
  std::string key() const {
    std::string k = std::to_string(P) + "/" + std::to_string(Q);
    for (const auto* v : {&S, &rope_delta, &prompt_of, &pad, &suffix}) {
      k += "|";
      for (int64_t x : *v) k += std::to_string(x) + ",";
    }
    return k;
  }
};

struct Shape {
  std::string name;
  int L, D, Hq, Hkv, d, I, T;
  CtxSpec ctx;
  DType wdt, cdt;  // checkpoint weight and cache dtypes
  int steps;
};

// GQA 1:1, 2:1 and 4:1; head dims 16 to 128; B 1 to 6 with S_b from 0 to P; negative rope deltas; f32, f16
// and bf16 weights and caches; NaN in every row no sample may read (after S, in the left padding, after a
// suffix), so a backend that reads one fails. The f16 shapes have enough rows for the cpu backend to split
// keys into chunks merged by log-sum-exp; the shared-prompt shapes (several samples naming one prompt, each
// with its own suffix rows, left padding) exercise the cascade over a prompt stored once.
inline const std::vector<Shape>& shapes() {
  using D = DType;
  static const std::vector<Shape> s = {
      {"mha_d16_B1_f32", 2, 32, 2, 2, 16, 64, 8, {12, {12}, {-5}}, D::F32, D::F32, 3},
      {"gqa2_d64_B3_bf16", 2, 64, 4, 2, 64, 128, 16, {40, {0, 17, 40}, {-30, 0, 7}}, D::BF16, D::BF16, 3},
      {"gqa4_d128_B2_f16_chunks", 2, 128, 8, 2, 128, 256, 8, {700, {650, 1}, {-250, 3}}, D::F16, D::F16, 2},
      {"gqa2_d48_B2_mixed", 2, 96, 2, 1, 48, 288, 5, {9, {3, 0}, {-2, -9}}, D::BF16, D::F32, 3},
      {"gqa2_d32_T64_B1_bf16", 3, 64, 4, 2, 32, 160, 64, {100, {100}, {-1200}}, D::BF16, D::BF16, 4},
      {"shared_G2_B4_suffix_leftpad", 2, 64, 4, 2, 32, 128, 8,
       {30, {30, 22}, {-10, -10, 4, -10}, {0, 0, 1, 0}, {3, 0}, 7, {5, 0, 7, 2}}, D::BF16, D::BF16, 3},
      {"shared_G1_B6_chunks_f16", 2, 128, 8, 2, 64, 256, 16,
       {600, {600}, {-300, -300, -300, -300, -300, -300}, {0, 0, 0, 0, 0, 0}, {40}, 120, {100, 120, 0, 37, 64, 119}},
       D::F16, D::F16, 2},
  };
  return s;
}

// Random weights and caches held in memory and exposed as views (the embedding path of the API).
class Problem {
 public:
  explicit Problem(const Shape& s, uint64_t seed = 1) : s_(s), rng_(seed), store_(std::make_shared<Store>()) {
    cfg.L = s.L; cfg.D = s.D; cfg.Hq = s.Hq; cfg.Hkv = s.Hkv; cfg.d = s.d; cfg.I = s.I; cfg.T = s.T;
    cfg.ain_hidden = 32; cfg.ain_layers = 2; cfg.num_steps = s.steps;
    const int D = s.D, qd = s.Hq * s.d, kd = s.Hkv * s.d;
    for (int l = 0; l < s.L; ++l) {
      LayerWeights lw;
      lw.input_norm = norm_weight(D);
      lw.post_norm = norm_weight(D);
      lw.q = matrix(qd, D);
      lw.k = matrix(kd, D);
      lw.v = matrix(kd, D);
      lw.o = matrix(D, qd);
      lw.q_norm = norm_weight(s.d);
      lw.k_norm = norm_weight(s.d);
      lw.gate = matrix(s.I, D);
      lw.up = matrix(s.I, D);
      lw.down = matrix(D, s.I);
      w.expert.layers.push_back(lw);
    }
    w.expert.final_norm = norm_weight(D);
    // action_in_proj: Linear(3F -> h), SiLU, [RMSNorm, Linear(h -> h), SiLU], RMSNorm, Linear(h -> D), LayerNorm.
    // A trained velocity field is smooth in x; random weights on sin(2 pi 100 x) features are chaotic (a
    // rounding difference at one step moves the next by O(1)). The first Linear's action-feature columns
    // are damped by 1/f as in the synthetic checkpoints (src/io/synthetic.cpp), and by a further 0.2 here so
    // that the tiny models' sampler gain stays near a trained model's.
    const int F = cfg.n_fourier, h = cfg.ain_hidden;
    std::vector<float> col_scale((cfg.A + 1) * F, 1.f);
    const std::vector<float> fr = fourier_freqs(F, cfg.max_freq, false);
    for (int a = 0; a < cfg.A; ++a)
      for (int j = 0; j < F / 2; ++j) col_scale[a * F + j] = col_scale[a * F + F / 2 + j] = 0.2f / fr[j];
    w.action_in.linear_w = {matrix(h, (cfg.A + 1) * F, 1.f, col_scale), matrix(h, h), matrix(D, h)};
    w.action_in.linear_b = {vec(h, 0.f, 0.1f), vec(h, 0.f, 0.1f), vec(D, 0.f, 0.1f)};
    w.action_in.norm_w = {norm_weight(h), norm_weight(h)};
    w.action_in.ln_w = norm_weight(D);
    w.action_in.ln_b = vec(D, 0.f, 0.1f);
    w.action_out = {matrix(cfg.A, D, 0.5f), vec(cfg.A, 0.f, 0.1f)};
  }

  std::shared_ptr<const Model> model(const std::string& backend, const std::string& format, int threads = 2,
                                     const std::vector<std::string>& bf16_weights = {}, const std::string& kv = "",
                                     const std::string& kernels = "", bool profile = false) const {
    BackendOptions o;
    o.profile = profile;
    o.weights = format;
    o.kv = kv;
    o.kernels = kernels;
    o.threads = threads;
    o.bf16_weights = bf16_weights;
    return Model::from_weights(cfg, w, store_, backend, o);
  }

  // A context of this shape's layout, or of another one (rebinding, guidance). The same spec gives the same
  // context (the values are drawn once).
  Context context() { return context(s_.ctx); }
  Context context(const CtxSpec& c) {
    const std::string key = c.key();
    if (auto it = contexts_.find(key); it != contexts_.end()) return it->second;
    KVCache kv;
    kv.G = static_cast<int>(c.S.size());
    kv.B = static_cast<int>(c.rope_delta.size());
    kv.Hkv = s_.Hkv;
    kv.P = c.P;
    kv.d = s_.d;
    kv.valid_len = c.S;
    kv.prefix_pad = c.pad;
    kv.prompt_of = c.prompt_of;
    std::vector<int64_t> lo = c.pad.empty() ? std::vector<int64_t>(kv.G, 0) : c.pad;
    for (int l = 0; l < s_.L; ++l) {
      kv.key.push_back(cache(c.P, lo, c.S, "key." + std::to_string(l)));
      kv.value.push_back(cache(c.P, lo, c.S, "value." + std::to_string(l)));
    }
    if (c.Q > 0) {
      kv.Q = c.Q;
      kv.suffix_len = c.suffix;
      const std::vector<int64_t> zero(kv.B, 0);
      for (int l = 0; l < s_.L; ++l) {
        kv.suffix_key.push_back(cache(c.Q, zero, c.suffix, "suffix_key." + std::to_string(l)));
        kv.suffix_value.push_back(cache(c.Q, zero, c.suffix, "suffix_value." + std::to_string(l)));
      }
    }
    std::vector<float> v0(kv.B);
    for (int b = 0; b < kv.B; ++b) v0[b] = 3.f + 2.f * b;
    return contexts_.emplace(key, Context::from_views(kv, c.rope_delta, std::nullopt, v0, "conformance context"))
        .first->second;
  }
  int batch() const { return static_cast<int>(s_.ctx.rope_delta.size()); }

  ExpertConfig cfg;
  ModelWeights w;

 private:
  using Store = std::deque<std::vector<uint8_t>>;

  TensorView store(const std::vector<float>& v, std::vector<int64_t> shape, DType dt, std::string name = "weight") {
    auto& bytes = store_->emplace_back(v.size() * dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::F32) std::memcpy(bytes.data() + 4 * i, &v[i], 4);
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      if (dt != DType::F32) std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    return TensorView{dt, std::move(shape), bytes.data(), std::move(name)};
  }
  TensorView matrix(int out, int in, float gain = 1.f, const std::vector<float>& col_scale = {}) {
    std::normal_distribution<float> n(0.f, gain / std::sqrt(static_cast<float>(in)));
    std::vector<float> v(size_t(out) * in);
    for (size_t i = 0; i < v.size(); ++i) v[i] = n(rng_) * (col_scale.empty() ? 1.f : col_scale[i % in]);
    return store(v, {out, in}, s_.wdt);
  }
  TensorView vec(int n, float mean, float sd) {
    std::normal_distribution<float> g(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = g(rng_);
    return store(v, {n}, s_.wdt);
  }
  TensorView norm_weight(int n) { return vec(n, 1.f, 0.1f); }
  // [N, Hkv, P, d]: N(0,1) rows in [lo[i], hi[i]), NaN garbage elsewhere (must never be read).
  TensorView cache(int P, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, std::string name) {
    std::normal_distribution<float> n(0.f, 1.f);
    const int N = static_cast<int>(hi.size());
    std::vector<float> v(size_t(N) * s_.Hkv * P * s_.d);
    size_t i = 0;
    for (int b = 0; b < N; ++b)
      for (int h = 0; h < s_.Hkv; ++h)
        for (int p = 0; p < P; ++p)
          for (int c = 0; c < s_.d; ++c, ++i) v[i] = p >= lo[b] && p < hi[b] ? n(rng_) : NAN;
    return store(v, {N, s_.Hkv, P, s_.d}, s_.cdt, std::move(name));
  }

  Shape s_;
  std::mt19937 rng_;
  std::shared_ptr<Store> store_;
  std::map<std::string, Context> contexts_;
};

struct Stats {
  double pcc, max_abs, ref_max;
};

// NaN anywhere makes max_abs NaN, so every bound below fails on it.
inline Stats compare(const float* a, const float* ref, size_t n) {
  double ma = 0, mr = 0, saa = 0, srr = 0, sar = 0, mx = 0, rmax = 0;
  for (size_t i = 0; i < n; ++i) { ma += a[i]; mr += ref[i]; }
  ma /= n; mr /= n;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i] - ma, y = ref[i] - mr;
    saa += x * x; srr += y * y; sar += x * y;
    const double diff = std::fabs(double(a[i]) - ref[i]);
    mx = std::isnan(diff) || std::isnan(mx) ? NAN : std::max(mx, diff);
    rmax = std::max(rmax, std::fabs(double(ref[i])));
  }
  const double pcc = saa == 0 && srr == 0 ? 1.0 : sar / std::sqrt(saa * srr);
  return {pcc, mx, rmax};
}
inline Stats compare(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return compare(a.data(), ref.data(), std::min(a.size(), ref.size()));
}

// Tolerances per weight format, against the fp32 reference (PCC, and max-abs relative to the largest
// reference value). `layer`: step 0's layer outputs and hidden states, where both sides see the same x_0.
// `sampler`: every v_k and x_N, whose inputs from step 1 on carry the earlier steps' differences times the
// velocity field's gain. `traj_rel`: the decoded waypoints' largest deviation in metres relative to the
// largest waypoint coordinate (horizons T * dt from 0.5 to 6.4 s).
// Measured on this table (ALPAMAYO_CONFORMANCE_REPORT=1 prints every figure):
//   bf16: layers PCC >= 0.999994, max-abs <= 0.51%; v_k PCC >= 0.99979, <= 1.9%; trajectories <= 0.31%
//         (14 mm of 9 m).
//   int8: layers PCC >= 0.99978, <= 3.0%; v_k PCC >= 0.9972, <= 6.5%; trajectories <= 4.2% (0.38 m of 9 m:
//         the tiny models' velocity fields have more gain than the full-size one, where int8 deviates 2.35 cm).
//   bfp8_b, bfp4_b (against the reference with the same block-quantised weights, oracle_format(), so only the bf16
//         activations differ, as for bf16): layers PCC >= 0.999995, max-abs <= 0.53%; v_k PCC >= 0.99990,
//         <= 0.87%; trajectories <= 0.29%. They take the bf16 row. (What the formats themselves do, against f32:
//         BlockFormatsAgainstF32 below.)
// The bounds leave 2-3x margin. f32: an exact fp32 backend (the reference itself), summation order only; the
// reference's bfp8_b / bfp4_b are its own oracle (the same code and weights), also exact.
struct Tolerance {
  double layer_pcc, layer_rel, sampler_pcc, sampler_rel, traj_rel;
};
inline Tolerance tolerance(const std::string& format) {
  if (format == "f32") return {0.999999, 1e-4, 0.999999, 1e-4, 1e-5};
  if (format == "bf16") return {0.9999, 0.012, 0.999, 0.05, 0.01};
  if (format == "int8") return {0.999, 0.07, 0.99, 0.15, 0.1};
  if (format == "bfp8_b" || format == "bfp4_b") return {0.9999, 0.012, 0.999, 0.05, 0.01};
  // fp8 (the cuda backend: e4m3 weights with per-output-channel scales, bf16 activations), from a host emulation
  // of its rounding on this table: layers PCC >= 0.99900, <= 6.2%; v_k >= 0.9949, <= 16%; trajectories <= 20%.
  if (format == "fp8") return {0.997, 0.15, 0.985, 0.4, 0.5};
  ADD_FAILURE() << "no tolerance stated for weight format '" << format << "': add it to tolerance()";
  return {1, 0, 1, 0, 0};
}

struct Target {
  std::string backend, format;
};
inline std::vector<Target> targets() {
  std::vector<Target> t;
  for (const BackendInfo& b : registered_backends())
    for (const std::string& f : b.weight_formats) t.push_back({b.name, f});
  return t;
}

// The KV cache formats (BackendInfo::kv_formats): every backend, with its default weight format, under every KV
// cache format it lists other than its first (the default, which the targets above run) that the reference also
// lists, i.e. "int8". Its oracle is the reference with the same KV cache format (the same rounded rows,
// docs/MATH.md "int8 KV cache") and oracle_format() of the weights.
struct KvTarget {
  std::string backend, format, kv;
};
inline std::vector<KvTarget> kv_targets() {
  const std::vector<std::string>& ref = find_backend("reference").kv_formats;
  std::vector<KvTarget> t;
  for (const BackendInfo& b : registered_backends())
    for (size_t i = 1; i < b.kv_formats.size(); ++i)
      if (std::find(ref.begin(), ref.end(), b.kv_formats[i]) != ref.end())
        t.push_back({b.name, b.weight_formats.front(), b.kv_formats[i]});
  return t;
}
inline std::string target_name(const KvTarget& t) { return t.backend + "_" + t.format + "_kv_" + t.kv; }

// The tolerance of a backend's int8 KV cache against the reference's (both round every attended key and value
// row to int8 with one scale per row, kv_int8.h, so the rows agree). Separate from tolerance(): besides its weight
// format's bf16 activations, the cpu backend's avx512_vnni attention also rounds each query row to int8 and the
// probabilities to 15 bits per row and key block (docs/CPU_BACKEND.md), which the fp32 reference does not.
// Measured on this table (cpu bf16 weights, kv int8, every kernel that reads int8 caches, AMD EPYC Zen 5; also
// ALPAMAYO_CPU_ISA=avx2): layers PCC >= 0.999992, max-abs <= 0.63%; v_k PCC >= 0.99977, <= 2.5%; trajectories
// <= 0.61%. Bounds about 2.5x those.
inline constexpr Tolerance kKvInt8Tolerance = {0.9999, 0.016, 0.999, 0.06, 0.016};
inline Tolerance kv_tolerance(const std::string& kv) {
  if (kv == "int8") return kKvInt8Tolerance;
  ADD_FAILURE() << "no tolerance stated for KV cache format '" << kv << "': add it to kv_tolerance()";
  return {1, 0, 1, 0, 0};
}

// A backend that cannot run on this machine (a GPU backend without a GPU) is reported as skipped, never
// as passed. Returns the reason, empty when the target runs.
inline std::string unavailable(const Target& t) { return find_backend(t.backend).unavailable(); }
inline std::string unavailable(const KvTarget& t) { return find_backend(t.backend).unavailable(); }
#define SKIP_IF_UNAVAILABLE(t)                                                  \
  if (const std::string why = unavailable(t); !why.empty()) GTEST_SKIP() << (t).backend << ": " << why

// The oracle of a format: the reference backend with the same weight format where it offers it (the same
// rounded weights, so only the kernels differ), else the exact fp32 reference.
inline std::string oracle_format(const std::string& format) {
  for (const std::string& f : find_backend("reference").weight_formats)
    if (f == format) return f;
  return "f32";
}
inline std::string target_name(const Target& t) { return t.backend + "_" + t.format; }

struct RunOut {
  SampleResult r;
  Captures cap;
};

inline RunOut run(const std::shared_ptr<const Model>& m, Context ctx, int capture_step, uint64_t seed = 11) {
  Session s(m);
  s.bind(std::move(ctx), {.capture = {.step = capture_step, .layers = true}});
  RunOut out;
  out.r = s.sample({.seed = seed, .all_steps = true});
  out.cap = s.captures();
  return out;
}

inline void expect_close(const Stats& st, double pcc, double rel, const std::string& what) {
  if (std::getenv("ALPAMAYO_CONFORMANCE_REPORT"))
    std::printf("  %-60s pcc %.7f  max_abs/max %.2e\n", what.c_str(), st.pcc, st.max_abs / std::max(st.ref_max, 1e-6));
  EXPECT_GE(st.pcc, pcc) << what;
  EXPECT_LE(st.max_abs, rel * std::max(st.ref_max, 1e-6)) << what << " (reference max " << st.ref_max << ")";
}
inline void expect_layer_close(const Stats& st, const Tolerance& t, const std::string& what) {
  expect_close(st, t.layer_pcc, t.layer_rel, what);
}
inline void expect_sampler_close(const Stats& st, const Tolerance& t, const std::string& what) {
  expect_close(st, t.sampler_pcc, t.sampler_rel, what);
}

}  // namespace alpamayo::conformance
