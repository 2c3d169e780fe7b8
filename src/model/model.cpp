#include "alpamayo/model.h"

#include <algorithm>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "backends/weight_formats.h"

namespace alpamayo {
namespace {

void expect_weight(const TensorView& t, const std::vector<int64_t>& shape) {
  expect_float(t);
  expect_shape(t, shape);
  expect_host_contiguous(t, "model loading");
  check(t.data != nullptr || t.numel() == 0, t.name + ": null data pointer");
  expect_finite(t);
}

}  // namespace

void validate_weights(const ExpertConfig& c, const ModelWeights& w) {
  check(c.L >= 1 && c.D > 0 && c.Hq > 0 && c.Hkv > 0 && c.d > 0 && c.I > 0 && c.T > 0 && c.A > 0,
        "expert config: every size must be positive (L=" + std::to_string(c.L) + " D=" + std::to_string(c.D) +
            " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " d=" + std::to_string(c.d) +
            " I=" + std::to_string(c.I) + " T=" + std::to_string(c.T) + " A=" + std::to_string(c.A) + ")");
  auto bound = [](int64_t v, int64_t hi, const char* what) {
    check(v <= hi, std::string("expert config: ") + what + " = " + std::to_string(v) + " is beyond the bound " +
                       std::to_string(hi) + " (limits.h)");
  };
  bound(c.L, limits::kMaxLayers, "layers L");
  bound(c.D, limits::kMaxHidden, "hidden size D");
  bound(c.I, limits::kMaxMlp, "MLP width I");
  bound(c.Hq, limits::kMaxHeads, "query heads Hq");
  bound(c.Hkv, limits::kMaxHeads, "KV heads Hkv");
  bound(c.d, limits::kMaxHeadDim, "head dim d");
  bound(c.T, limits::kMaxWaypoints, "waypoints T");
  bound(c.ain_hidden, limits::kMaxHidden, "action_in_proj hidden size");
  bound(c.ain_layers, limits::kMaxEncLayers, "action_in_proj layers");
  bound(c.n_fourier, limits::kMaxFourier, "Fourier features");
  // The numbers config.json parsing bounds (config_json.cpp), for configs built by a caller.
  check_range(c.dt, limits::kMinDt, limits::kMaxDt, "expert config: dt", " seconds");
  check_range(c.accel_mean, -limits::kMaxActionStat, limits::kMaxActionStat, "expert config: accel_mean");
  check_range(c.curvature_mean, -limits::kMaxActionStat, limits::kMaxActionStat, "expert config: curvature_mean");
  check(c.accel_std > 0 && c.curvature_std > 0, "expert config: accel_std and curvature_std must be positive");
  check_range(c.accel_std, 0, limits::kMaxActionStat, "expert config: accel_std");
  check_range(c.curvature_std, 0, limits::kMaxActionStat, "expert config: curvature_std");
  check_range(c.v_lambda, 0, limits::kMaxFitWeight, "expert config: v_lambda");
  check_range(c.v_ridge, 0, limits::kMaxFitWeight, "expert config: v_ridge");
  check_range(c.num_steps, 1, limits::kMaxSteps, "expert config: num_inference_steps");
  check_range(c.max_freq, 0, limits::kMaxFreq, "expert config: max_freq");
  check(c.rms_eps > 0 && c.rms_eps < 1, "expert config: rms_eps must be in (0, 1), found " + std::to_string(c.rms_eps));
  check_range(c.rope_theta, 1, limits::kMaxRopeTheta, "expert config: rope_theta");
  check(c.ain_hidden > 0 && c.ain_layers > 0 && c.n_fourier > 0,
        "expert config: action_in_proj sizes must be positive (hidden " + std::to_string(c.ain_hidden) + ", layers " +
            std::to_string(c.ain_layers) + ", Fourier features " + std::to_string(c.n_fourier) + ")");
  check(c.Hq % c.Hkv == 0, "expert config: query heads (" + std::to_string(c.Hq) +
                               ") must be a multiple of KV heads (" + std::to_string(c.Hkv) + ")");
  check(c.d % 2 == 0, "expert config: head dim must be even for rotary embeddings, found " + std::to_string(c.d));
  check(static_cast<int>(w.expert.layers.size()) == c.L,
        "expert weights: " + std::to_string(w.expert.layers.size()) + " layers for L=" + std::to_string(c.L));
  const int64_t D = c.D, q = int64_t(c.Hq) * c.d, kv = int64_t(c.Hkv) * c.d, I = c.I, d = c.d;
  for (const LayerWeights& l : w.expert.layers) {
    expect_weight(l.input_norm, {D});
    expect_weight(l.post_norm, {D});
    expect_weight(l.q, {q, D});
    expect_weight(l.k, {kv, D});
    expect_weight(l.v, {kv, D});
    expect_weight(l.o, {D, q});
    expect_weight(l.q_norm, {d});
    expect_weight(l.k_norm, {d});
    expect_weight(l.gate, {I, D});
    expect_weight(l.up, {I, D});
    expect_weight(l.down, {D, I});
  }
  expect_weight(w.expert.final_norm, {D});

  const ActionInProjWeights& a = w.action_in;
  check(a.linear_w.size() == size_t(c.ain_layers) + 1 && a.linear_b.size() == a.linear_w.size() &&
            a.norm_w.size() == size_t(c.ain_layers),
        "action_in_proj: expected " + std::to_string(c.ain_layers + 1) + " Linears and " +
            std::to_string(c.ain_layers) + " RMSNorms, found " + std::to_string(a.linear_w.size()) + " and " +
            std::to_string(a.norm_w.size()));
  int64_t width = int64_t(c.A + 1) * c.n_fourier;
  for (size_t i = 0; i < a.linear_w.size(); ++i) {
    const int64_t out = i + 1 < a.linear_w.size() ? c.ain_hidden : D;
    if (i > 0) expect_weight(a.norm_w[i - 1], {width});  // the RMSNorm before Linear i
    expect_weight(a.linear_w[i], {out, width});
    expect_weight(a.linear_b[i], {out});
    width = out;
  }
  expect_weight(a.ln_w, {D});
  expect_weight(a.ln_b, {D});
  check(a.freqs.empty() || a.freqs.size() == size_t(c.A) + 1,
        "action_in_proj: expected " + std::to_string(c.A + 1) + " Fourier frequency buffers or none, found " +
            std::to_string(a.freqs.size()));
  for (const TensorView& f : a.freqs) {
    expect_float(f);
    expect_host_contiguous(f, "model loading");
    expect_finite(f);
    check(f.numel() == c.n_fourier / 2, f.name + ": expected " + std::to_string(c.n_fourier / 2) +
                                            " frequencies, found shape " + shape_str(f.shape));
  }
  expect_weight(w.action_out.w, {c.A, D});
  expect_weight(w.action_out.b, {c.A});
}

std::shared_ptr<const Model> Model::from_weights(const ExpertConfig& cfg, const ModelWeights& w,
                                                 std::shared_ptr<const void> owner, const std::string& backend,
                                                 const BackendOptions& opts) {
  const BackendInfo& info = find_backend(backend.empty() ? backend_names().front() : backend);
  BackendOptions o = opts;
  // An empty format means the backend's first; one it does not offer is an error naming those it does.
  auto choose = [&](std::string& f, const std::vector<std::string>& fmts, const char* what) {
    if (f.empty()) f = fmts.front();
    if (std::find(fmts.begin(), fmts.end(), f) != fmts.end()) return;
    std::string offered;
    for (const auto& x : fmts) offered += (offered.empty() ? "" : ", ") + x;
    throw Error("backend " + info.name + ": unknown " + what + " '" + f + "' (it offers " + offered + ")");
  };
  choose(o.weights, info.weight_formats, "weight format");
  choose(o.kv, info.kv_formats, "KV cache format");
  check(o.threads >= 0, "backend " + info.name + ": threads must be >= 0, found " + std::to_string(o.threads));
  parse_weight_format(o);  // checks the bf16 weights list against the format
  check(o.kernels.empty() || info.kernel_choices,
        "backend " + info.name + ": kernels \"" + o.kernels + "\" given, but this backend has no kernels to choose");
  if (const std::string why = info.unavailable(); !why.empty())
    throw Error("backend " + info.name + " cannot run here: " + why);
  const StageScope stage("loading the model into the " + info.name + " backend (" + o.weights + " weights, L " +
                         std::to_string(cfg.L) + ", D " + std::to_string(cfg.D) + ", I " + std::to_string(cfg.I) + ")");
  validate_weights(cfg, w);
  check_memory(estimate_model_memory(cfg, info.name, o.weights),
               "loading the model into the " + info.name + " backend (" + o.weights + " weights)");
  auto m = std::shared_ptr<Model>(new Model());
  m->views_ = w;
  m->cfg_ = cfg;
  m->name_ = info.name;
  m->kv_ = o.kv;
  m->owner_ = std::move(owner);
  m->backend_ = info.load(cfg, w, o);
  return m;
}

std::shared_ptr<const Model> Model::load(std::shared_ptr<const Checkpoint> ckpt, const std::string& backend,
                                         const BackendOptions& opts) {
  check(ckpt != nullptr, "Model::load: null checkpoint");
  const ModelWeights w = ckpt->weights();
  const ExpertConfig cfg = ckpt->config();
  return from_weights(cfg, w, std::move(ckpt), backend, opts);
}

}  // namespace alpamayo
