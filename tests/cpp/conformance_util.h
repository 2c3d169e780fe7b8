// What the conformance suite compares and how (tests/cpp/test_conformance.cpp): the table of shapes, random
// problems held in memory, the targets (every registered backend x weight format), the comparison statistics
// and the bounds of the error model (error_model.h). Shared with the cuda_emu backend's own tests
// (tests/cuda_emu/test_cuda_emulated.cpp).
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

#include "alpamayo/action_space.h"
#include "alpamayo/engine.h"
#include "alpamayo/error.h"
#include "error_model.h"
#include "model/fourier.h"
#include "model/sampler.h"

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

// A KVCache's sizes, lengths and indices for a layout (no tensors).
inline KVCache layout(const CtxSpec& c, int Hkv, int d) {
  KVCache kv;
  kv.G = static_cast<int>(c.S.size());
  kv.B = static_cast<int>(c.rope_delta.size());
  kv.Hkv = Hkv;
  kv.P = c.P;
  kv.d = d;
  kv.valid_len = c.S;
  kv.prefix_pad = c.pad;
  kv.prompt_of = c.prompt_of;
  if (c.Q > 0) {
    kv.Q = c.Q;
    kv.suffix_len = c.suffix;
  }
  return kv;
}

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
                                     const std::string& kernels = "", bool profile = false,
                                     const std::string& isa_cap = "") const {
    BackendOptions o;
    o.profile = profile;
    o.isa_cap = isa_cap;
    o.weights = format;
    o.kv = kv;
    o.kernels = kernels;
    o.threads = threads;
    o.bf16_weights = bf16_weights;
    return model(backend, o);
  }
  std::shared_ptr<const Model> model(const std::string& backend, const BackendOptions& o) const {
    return Model::from_weights(cfg, w, store_, backend, o);
  }

  // A context of this shape's layout, or of another one (rebinding, guidance). The same spec gives the same
  // context (the values are drawn once).
  Context context() { return context(s_.ctx); }
  Context context(const CtxSpec& c) {
    const std::string key = c.key();
    if (auto it = contexts_.find(key); it != contexts_.end()) return it->second;
    KVCache kv = layout(c, s_.Hkv, s_.d);
    std::vector<int64_t> lo = c.pad.empty() ? std::vector<int64_t>(kv.G, 0) : c.pad;
    for (int l = 0; l < s_.L; ++l) {
      kv.key.push_back(cache(c.P, lo, c.S, "key." + std::to_string(l)));
      kv.value.push_back(cache(c.P, lo, c.S, "value." + std::to_string(l)));
    }
    if (c.Q > 0) {
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
  int64_t keys() const { return int64_t(s_.ctx.P) + s_.ctx.Q + s_.T; }  // the most a query attends to

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
  double pcc, max_abs, ref_max, ref_rms = 0, ref_std = 0;
  size_t n = 0;
};

// NaN anywhere makes max_abs NaN, so every bound below fails on it.
inline Stats compare(const float* a, const float* ref, size_t n) {
  double ma = 0, mr = 0, saa = 0, srr = 0, sar = 0, mx = 0, rmax = 0, r2 = 0;
  for (size_t i = 0; i < n; ++i) { ma += a[i]; mr += ref[i]; }
  ma /= n; mr /= n;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i] - ma, y = ref[i] - mr;
    saa += x * x; srr += y * y; sar += x * y;
    r2 += double(ref[i]) * ref[i];
    const double diff = std::fabs(double(a[i]) - ref[i]);
    mx = std::isnan(diff) || std::isnan(mx) ? NAN : std::max(mx, diff);
    rmax = std::max(rmax, std::fabs(double(ref[i])));
  }
  const double pcc = saa == 0 && srr == 0 ? 1.0 : sar / std::sqrt(saa * srr);
  return {pcc, mx, rmax, std::sqrt(r2 / n), std::sqrt(srr / n), n};
}
inline Stats compare(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return compare(a.data(), ref.data(), std::min(a.size(), ref.size()));
}

// The error model (error_model.h) of a run against its oracle on problem p.
//   act: what the run rounds besides the weights: "f32" (the reference backend: nothing), "bf16" (the cpu and cuda
//        backends: the four matmul inputs, q, k, v and the probabilities in bf16), "int8" (the cpu backend's int8
//        weights: u8 matmul inputs, bf16 attention), "fp8" (cuda W8A8: e4m3 matmul inputs, bf16 attention);
//   weights / oracle_weights: the formats the run's and the oracle's weight matrices are in: where they differ, each
//        of the 7 matrices of a layer is a site with the error that format puts on these very weights (0 for bf16
//        weights of a bf16 checkpoint);
//   kv: "int8" against a reference with the same int8 cache rows: the cpu kernel for it also rounds each query row to
//        int8 and the probabilities to 15 bits per row and key block (docs/CPU_BACKEND.md).
inline ErrorModel error_model_for(const ModelWeights& w, const ExpertConfig& c, int64_t keys, const std::string& act,
                                  const std::string& weights, const std::string& oracle_weights,
                                  const std::string& kv = "") {
  std::vector<double> sites;
  const double a = act == "bf16" ? kEpsBf16 : act == "int8" ? eps_int8(kKappaAct) : act == "fp8" ? 0x1p-4 / std::sqrt(3.0) : 0;
  if (act != "f32") {
    for (int i = 0; i < 4; ++i) sites.push_back(a);         // qkv input, attention output, MLP input, silu * up
    for (int i = 0; i < 4; ++i) sites.push_back(kEpsBf16);  // q, k, v, probabilities
  }
  if (weights != oracle_weights) {
    std::vector<float> buf;
    auto err = [&](const TensorView& t) {
      buf.resize(size_t(t.numel()));
      convert_to_f32(t, buf.data());
      return weight_format_error(weights, buf, int(t.shape[0]), int(t.shape[1]));
    };
    for (auto m : {&LayerWeights::q, &LayerWeights::k, &LayerWeights::v, &LayerWeights::o, &LayerWeights::gate,
                   &LayerWeights::up, &LayerWeights::down}) {
      double e = 0;
      for (const LayerWeights& lw : w.expert.layers) e = std::max(e, err(lw.*m));
      sites.push_back(e);
    }
  }
  if (kv == "int8") {
    sites.push_back(eps_int8(kKappaAct));                  // the query rows
    sites.push_back(kKappaAct * 0x1p-15 / std::sqrt(3.0));  // 15-bit probabilities against the row's largest
  }
  return error_model(sites, {c.D, int64_t(c.Hq) * c.d, c.I, c.d, keys});
}
inline ErrorModel error_model_for(const Problem& p, const std::string& act, const std::string& weights,
                                  const std::string& oracle_weights, const std::string& kv = "") {
  return error_model_for(p.w, p.cfg, p.keys(), act, weights, oracle_weights, kv);
}

// The depth of a compared tensor (error_model.h): action_in_proj's output 1, layer l's output l + 2, the final hidden
// state L + 1, a velocity L + 2.
inline int depth_emb() { return 1; }
inline int depth_layer(int l) { return l + 2; }
inline int depth_hidden(int L) { return L + 1; }
inline int depth_v(int L) { return L + 2; }

inline double rms(const float* v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(v[i]) * v[i];
  return n ? std::sqrt(s / n) : 0.0;
}

// rms_bound: the bound on rms(e), rho rms(r) (or a sum of such terms, for guidance).
inline void expect_within_rms(const Stats& st, double rms_bound, const std::string& what) {
  const double r = st.ref_std > 0 ? rms_bound / st.ref_std : 0.0;
  const double pcc_floor = r < 1 ? std::sqrt(1 - r * r) : 0.0;
  const double bound = z_factor(st.n) * rms_bound;
  if (std::getenv("ALPAMAYO_CONFORMANCE_REPORT"))
    std::printf("  %-64s pcc %.7f (>= %.7f, ratio %.3f)  max_abs %.2e (<= %.2e, ratio %.3f)\n", what.c_str(), st.pcc,
                pcc_floor, pcc_floor < 1 ? std::sqrt(std::max(0.0, 1 - st.pcc) / (1 - pcc_floor)) : 0.0, st.max_abs,
                bound, bound > 0 ? st.max_abs / bound : 0.0);
  EXPECT_GE(st.pcc, pcc_floor) << what << " (rms bound " << rms_bound << ", reference std " << st.ref_std << ")";
  EXPECT_LE(st.max_abs, bound) << what << " (rms bound " << rms_bound << ", reference rms " << st.ref_rms << ")";
}
inline void expect_within(const Stats& st, const ErrorModel& m, int depth, const std::string& what) {
  expect_within_rms(st, m.rho(depth) * st.ref_rms, what);
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

// A backend that cannot run on this machine (a GPU backend without a GPU) is reported as skipped, never
// as passed. Returns the reason, empty when the target runs.
inline std::string unavailable(const Target& t) { return find_backend(t.backend).unavailable(); }
inline std::string unavailable(const KvTarget& t) { return find_backend(t.backend).unavailable(); }
#define SKIP_IF_UNAVAILABLE(t)                                                  \
  if (const std::string why = unavailable(t); !why.empty()) GTEST_SKIP() << (t).backend << ": " << why

// The matrix comes from the declarations (BackendInfo::features): a case that needs a feature the backend does not
// declare is skipped with the feature named, never run to fail; BackendFeatures.UndeclaredCasesAreRefused* proves
// that Session::bind refuses exactly those cases. Returns the reason, empty when the backend declares the case.
inline std::string undeclared(const std::string& backend, const Shape& sh, const CtxSpec& ctx, bool guided) {
  ExpertConfig c;
  c.L = sh.L, c.D = sh.D, c.Hq = sh.Hq, c.Hkv = sh.Hkv, c.d = sh.d, c.I = sh.I, c.T = sh.T;
  KVCache kv = layout(ctx, sh.Hkv, sh.d);
  if (ctx.Q > 0) kv.suffix_key.resize(1);  // only its presence is read
  const std::string missing = missing_feature(find_backend(backend).features, c, kv, guided);
  return missing.empty() ? "" : backend + " does not declare " + missing;
}
inline std::string undeclared(const std::string& backend, const Shape& sh, bool guided = false) {
  return undeclared(backend, sh, sh.ctx, guided);
}
// A backend that ignores BackendOptions::threads (a device backend) has no thread-count behaviour to test.
#define SKIP_UNLESS_THREADED(backend)                  \
  if (!find_backend(backend).features.host_threads) GTEST_SKIP() << (backend) << " does not use host threads"
#define SKIP_UNLESS_DECLARED(backend, ...)                                                     \
  if (const std::string why = undeclared(backend, __VA_ARGS__); !why.empty()) GTEST_SKIP() << why

// The oracle of a format: the reference backend with the same weight format where it offers it (the same
// rounded weights, so only the kernels differ), else the exact fp32 reference.
inline std::string oracle_format(const std::string& format) {
  for (const std::string& f : find_backend("reference").weight_formats)
    if (f == format) return f;
  return "f32";
}
inline std::string target_name(const Target& t) { return t.backend + "_" + t.format; }

// A target's run (backend, weight format, KV cache format) against its oracle: the reference with oracle_format()
// and the same KV cache format, which rounds the cache rows as the target does.
inline ErrorModel target_error_model(const Problem& p, const std::string& backend, const std::string& format,
                                     const std::string& kv = "") {
  if (backend == "reference") return error_model_for(p, "f32", format, oracle_format(format));
  return error_model_for(p, format == "int8" ? "int8" : "bf16", format, oracle_format(format), kv);
}


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

// The oracle's velocities at the run's own x_k (teacher-forced): for each k one Euler step of `oracle` from x_k
// over [t_k, t_k+1] through the backend seam, so each v_k is compared without the earlier steps' differences.
// x_steps [steps + 1, B, T, A]; guidance: the unguided context and weight, as bound with the run.
inline std::vector<float> teacher_forced_v(const Model& oracle, const Context& ctx, const std::vector<float>& x_steps,
                                           int steps, const Context* unguided = nullptr, double weight = 1.0) {
  const ExpertConfig& c = oracle.config();
  auto offsets = [](const KVCache& kv) {
    std::vector<int64_t> o(kv.B);
    for (int b = 0; b < kv.B; ++b) o[b] = kv.offset(b);
    return o;
  };
  Binding b;
  b.kv = ctx.kv();
  b.rope = make_rope_tables(offsets(b.kv), ctx.rope_delta(), c.T, c.d, c.rope_theta);
  if (unguided) {
    b.guided = true;
    b.unguided_kv = unguided->kv();
    b.unguided_rope = make_rope_tables(offsets(b.unguided_kv), unguided->rope_delta(), c.T, c.d, c.rope_theta);
    b.guidance_weight = weight;
  }
  auto s = oracle.backend().new_session();
  s->bind(b);
  const size_t n = size_t(b.kv.B) * c.T * c.A;
  EXPECT_EQ(x_steps.size(), n * (steps + 1));
  const std::vector<float> times = euler_time_grid(steps);
  std::vector<float> v(n * steps), x(n);
  for (int k = 0; k < steps; ++k) {
    std::copy(x_steps.begin() + k * n, x_steps.begin() + (k + 1) * n, x.begin());
    const float t[2] = {times[k], times[k + 1]};
    s->denoise({.x = x.data(), .times = t, .steps = 1, .v_steps = v.data() + k * n});
  }
  return v;
}

// The run's own sampler arithmetic: x_{k+1} = x_k + dt_k v_k in fp32 (two roundings), x_N == the action, and its
// waypoints the decode of its own action (shared host code: exact).
inline void expect_sampler_consistent(const SampleResult& r, const ExpertConfig& c, const std::string& at) {
  const size_t n = size_t(r.B) * r.T * r.A;
  const std::vector<float> times = euler_time_grid(r.steps);
  ASSERT_EQ(r.x_steps.size(), n * (r.steps + 1)) << at;
  for (int k = 0; k < r.steps; ++k) {
    const float dt = times[k + 1] - times[k];
    double err = 0, xmax = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want = r.x_steps[k * n + i] + dt * r.v_steps[k * n + i];
      err = std::max(err, std::fabs(double(r.x_steps[(k + 1) * n + i]) - want));
      xmax = std::max(xmax, std::fabs(double(want)));
    }
    EXPECT_LE(err, 2 * kU32 * xmax) << at << ": x_" << k + 1 << " = x_" << k << " + dt v_" << k;
  }
  EXPECT_TRUE(std::equal(r.action.begin(), r.action.end(), r.x_steps.begin() + r.steps * n)) << at << ": x_N";
  for (int b = 0; b < r.B; ++b) {
    // No ego history in these contexts: z = 0.
    const Trajectory tr = decode_action(r.action.data() + size_t(b) * r.T * r.A, r.T, r.v0[b], 0.0, c);
    EXPECT_TRUE(std::equal(tr.xyz.begin(), tr.xyz.end(), r.xyz.begin() + size_t(b) * r.T * 3))
        << at << ": waypoints of sample " << b << " are not the decode of its action";
  }
}

// The free-running difference (x_N and waypoints), printed with ALPAMAYO_CONFORMANCE_REPORT: it is the per-step
// differences bounded above carried through the sampler, whose gain bound is far above what it does (ACCURACY.md).
inline void report_free_running(const SampleResult& got, const SampleResult& ref, const std::string& at) {
  if (!std::getenv("ALPAMAYO_CONFORMANCE_REPORT")) return;
  const Stats st = compare(got.action, ref.action);
  double dev = 0, extent = 0;
  for (size_t i = 0; i < got.xyz.size() && i < ref.xyz.size(); ++i) {
    dev = std::max(dev, double(std::fabs(got.xyz[i] - ref.xyz[i])));
    extent = std::max(extent, double(std::fabs(ref.xyz[i])));
  }
  std::printf("  %-64s free-running x_N pcc %.7f max_abs %.2e; waypoints %.2e m of %.1f m\n", at.c_str(), st.pcc,
              st.max_abs, dev, extent);
}

// got against its oracle under the error model em: step 0's action_in_proj output, layers and final hidden state
// (both sides see the same x_0), every v_k teacher-forced (the oracle's velocity at got's own x_k, so each step is
// compared without the earlier steps' differences), got's own Euler updates and decode, and v0. The free-running
// x_N and waypoints follow from those and are reported (ALPAMAYO_CONFORMANCE_REPORT=1).
inline void expect_run_close(const RunOut& got, const RunOut& ref, const Model& oracle, const Context& ctx,
                      const ErrorModel& em, const Shape& sh, const std::string& at) {
  ASSERT_EQ(got.cap.step, 0) << at;
  ASSERT_EQ(got.cap.layers.size(), size_t(sh.L)) << at;
  expect_within(compare(got.cap.emb, ref.cap.emb), em, depth_emb(), at + " action_in_proj output at step 0");
  for (int l = 0; l < sh.L; ++l)
    expect_within(compare(got.cap.layers[l], ref.cap.layers[l]), em, depth_layer(l), at + " layer " + std::to_string(l));
  expect_within(compare(got.cap.hidden, ref.cap.hidden), em, depth_hidden(sh.L), at + " final hidden");

  const size_t n = size_t(got.r.B) * sh.T * 2;
  ASSERT_EQ(got.r.v_steps.size(), n * sh.steps) << at;
  EXPECT_TRUE(std::equal(got.r.x_steps.begin(), got.r.x_steps.begin() + n, ref.r.x_steps.begin())) << at << ": x_0";
  const std::vector<float> vt = teacher_forced_v(oracle, ctx, got.r.x_steps, sh.steps);
  for (int k = 0; k < sh.steps; ++k)
    expect_within(compare(got.r.v_steps.data() + k * n, vt.data() + k * n, n), em, depth_v(sh.L),
                  at + " v_" + std::to_string(k) + " (teacher-forced)");
  expect_sampler_consistent(got.r, oracle.config(), at);
  report_free_running(got.r, ref.r, at);
  EXPECT_EQ(got.r.v0, ref.r.v0) << at;
}

}  // namespace alpamayo::conformance
