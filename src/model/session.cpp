// Session: the non-virtual part of the seam. Every input is validated here once; backends assume valid input.
#include "alpamayo/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "alpamayo/action_space.h"
#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "backends/diagnosis.h"
#include "model/sampler.h"

namespace alpamayo {

Session::Session(std::shared_ptr<const Model> model) : model_(std::move(model)) {
  check(model_ != nullptr, "Session: null model");
  backend_ = model_->backend().new_session();
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const Context& Session::context() const {
  check(ctx_.has_value(), ErrorCode::InvalidState, "Session: no context bound (call bind first)");
  return *ctx_;
}

namespace {

void check_readable(const Context& ctx, const Model& m) {
  const KVCache& kv = ctx.kv();
  for (const auto* list : {&kv.key, &kv.value, &kv.suffix_key, &kv.suffix_value})
    for (const TensorView& t : *list)
      check(m.backend().can_read(t.device), ErrorCode::Unsupported, t.name + ": lives in " + t.device.str() + " memory, which the " +
                                                m.backend_name() + " backend cannot read");
}

// Refuses, once and before the backend sees it, a context that needs a feature the backend does not declare
// (BackendInfo::features).
void check_features(const Context& ctx, const std::string& backend, const ExpertConfig& c, bool guided) {
  const std::string missing = missing_feature(find_backend(backend).features, c, ctx.kv(), guided);
  if (missing.empty()) return;
  std::string others;
  for (const BackendInfo& b : registered_backends())
    if (b.name != backend && missing_feature(b.features, c, ctx.kv(), guided).empty())
      others += (others.empty() ? "" : ", ") + b.name;
  throw Error(ErrorCode::Unsupported, ctx.name() + ": the " + backend + " backend does not run " + missing +
              (others.empty() ? std::string() : " (backends that do: " + others + ")"));
}

// The binding's cache without the fields that say nothing: prefix_pad of zeros, prompt_of as the identity. Every
// backend reads them through KVCache's accessors, which give the same values either way; a backend that does
// not declare left padding or shared prompts then never sees them.
KVCache plain(KVCache kv) {
  if (std::all_of(kv.prefix_pad.begin(), kv.prefix_pad.end(), [](int64_t p) { return p == 0; })) kv.prefix_pad.clear();
  bool identity = kv.G == kv.B;
  for (int b = 0; b < kv.B && identity; ++b) identity = kv.prompt(b) == b;
  if (identity) kv.prompt_of.clear();
  return kv;
}

std::vector<int64_t> offsets(const KVCache& kv) {
  std::vector<int64_t> o(kv.B);
  for (int b = 0; b < kv.B; ++b) o[b] = kv.offset(b);
  return o;
}

// Appended to a non-finite failure of layer l: the tensors that layer reads, with a non-finite value or the
// largest magnitude (one layer's weights and cache rows in use are scanned: cheap next to the step re-run).
std::string layer_culprits(const ModelWeights& w, const KVCache& kv, int l) {
  if (l < 0 || l >= static_cast<int>(w.expert.layers.size())) return "";
  const LayerWeights& lw = w.expert.layers[l];
  std::string big, bad;
  float big_v = -1;
  auto look = [&](const TensorView& t, const std::string& label, int64_t begin, int64_t end) {
    if (!t.device.host_accessible() || !t.is_contiguous() || t.data == nullptr) return;
    const FiniteScan s = scan_finite(t, begin, end);
    if (s.first_bad >= 0 && bad.empty()) bad = label + " holds a non-finite value at " + index_str(t.shape, s.first_bad);
    if (s.argmax >= 0 && s.max_abs > big_v) {
      big_v = s.max_abs;
      char v[32];
      std::snprintf(v, sizeof v, "%.3g", s.max_abs);
      big = label + " = " + v + " at " + index_str(t.shape, s.argmax);
    }
  };
  const std::pair<const TensorView*, const char*> ws[] = {
      {&lw.input_norm, "input_layernorm.weight"}, {&lw.q, "self_attn.q_proj.weight"}, {&lw.k, "self_attn.k_proj.weight"},
      {&lw.v, "self_attn.v_proj.weight"}, {&lw.q_norm, "self_attn.q_norm.weight"}, {&lw.k_norm, "self_attn.k_norm.weight"},
      {&lw.o, "self_attn.o_proj.weight"}, {&lw.post_norm, "post_attention_layernorm.weight"},
      {&lw.gate, "mlp.gate_proj.weight"}, {&lw.up, "mlp.up_proj.weight"}, {&lw.down, "mlp.down_proj.weight"}};
  for (const auto& [t, n] : ws) look(*t, t->name.empty() ? std::string(n) : t->name, 0, -1);
  // Cache rows some sample attends to (the rows past valid_len are padding and may hold anything).
  if (l < static_cast<int>(kv.key.size()))
    for (const TensorView* t : {&kv.key[l], &kv.value[l]})
      for (int g = 0; g < kv.G; ++g)
        for (int h = 0; h < kv.Hkv; ++h) {
          const std::string label = t->name.empty() ? "cache layer " + std::to_string(l) : t->name;
          if (kv.paged() || !t->is_contiguous()) {  // row by row where rows are not one run
            for (int64_t i = kv.pad(g); i < kv.valid_len[g]; ++i)
              look(kv_row_view(kv, *t, false, g, h, i),
                   label + " (prompt " + std::to_string(g) + ", head " + std::to_string(h) + ", row " +
                       std::to_string(i) + ")",
                   0, -1);
            continue;
          }
          const int64_t base = (int64_t(g) * kv.Hkv + h) * kv.P;
          look(*t, label, (base + kv.pad(g)) * kv.d, (base + kv.valid_len[g]) * kv.d);
        }
  std::string s;
  if (!bad.empty()) s += "; " + bad;
  if (!big.empty()) s += "; the largest value layer " + std::to_string(l) + " reads is |" + big.substr(0, big.find(" = ")) +
                         "|" + big.substr(big.find(" = "));
  return s;
}

}  // namespace

std::string Session::culprits(int layer, bool unguided) const {
  const std::optional<Context>& c = unguided ? unguided_ : ctx_;
  return c ? layer_culprits(model_->weight_views(), c->kv(), layer) : std::string();
}

// The operation inside the failing layer: the layer re-run from its (finite) input in the fp32 reference, op
// by op, until one output is non-finite. The reference reproduces an overflow of huge weights or activations;
// where it does not (a backend's own rounding), nothing is added.
std::string Session::layer_stage(const NonFiniteError& e) const {
  const std::optional<Context>& cx = e.unguided ? unguided_ : ctx_;
  const ExpertConfig& c = model_->config();
  const ModelWeights& w = model_->weight_views();
  if (!cx || e.layer < 0 || e.layer >= static_cast<int>(w.expert.layers.size()) ||
      e.input.size() != size_t(cx->batch()) * c.T * c.D)
    return "";
  try {
    const KVCache& kv = cx->kv();
    for (const auto* list : {&kv.key, &kv.value, &kv.suffix_key, &kv.suffix_value})
      for (const TensorView& t : *list)
        if (!t.device.host_accessible()) return "";
    const RopeTables rope = make_rope_tables(offsets(kv), cx->rope_delta(), c.T, c.d, c.rope_theta);
    const std::string found = first_non_finite_stage(c, w.expert.layers[e.layer], kv, e.layer, rope, e.input);
    return found.empty() ? "" : "; inside layer " + std::to_string(e.layer) + " the first non-finite output is " + found;
  } catch (const std::exception&) {
    return "";  // the diagnosis never replaces the error it explains
  }
}

void Session::bind(Context ctx, const BindOptions& opts) {
  const ExpertConfig& c = model_->config();
  ctx_.reset();  // a failed bind leaves the session unbound, never half-bound
  unguided_.reset();
  ctx.check_compatible(c);
  check_readable(ctx, *model_);
  check_features(ctx, model_->backend_name(), c, opts.guidance.has_value());
  check(opts.capture.step >= -1, "bind: capture step must be -1 (none) or a step index, found " +
                                     std::to_string(opts.capture.step));
  {  // memory: estimated from the sizes before the backend allocates anything
    const KVCache* u = opts.guidance ? &opts.guidance->unguided.kv() : nullptr;
    check_memory(estimate_session_memory(c, model_->backend_name(), ctx.kv(), u,
                                         opts.capture.step >= 0 && opts.capture.layers),
                 "binding " + ctx.name() + " (B " + std::to_string(ctx.batch()) + ", cache rows P " +
                     std::to_string(ctx.kv().P) + ", T " + std::to_string(c.T) + ") to the " +
                     model_->backend_name() + " backend");
  }
  const StageScope stage("binding " + ctx.name() + " (B " + std::to_string(ctx.batch()) + ", cache rows P " +
                         std::to_string(ctx.kv().P) + ") to the " + model_->backend_name() + " backend");
  Binding b;
  b.kv = plain(ctx.kv());
  b.rope = make_rope_tables(offsets(b.kv), ctx.rope_delta(), c.T, c.d, c.rope_theta);
  b.capture = opts.capture;
  if (opts.guidance) {
    const Context& u = opts.guidance->unguided;
    const double w = opts.guidance->weight;
    check(std::isfinite(w) && w >= 0 && w <= limits::kMaxGuidanceWeight,
          "guidance weight must be finite and in [0, 1000], found " + std::to_string(w));
    u.check_compatible(c);
    check(u.batch() == ctx.batch(), u.name() + ": the guidance context has " + std::to_string(u.batch()) +
                                        " samples, the guided context " + ctx.name() + " has " +
                                        std::to_string(ctx.batch()));
    check_readable(u, *model_);
    check_features(u, model_->backend_name(), c, true);
    b.guided = true;
    b.unguided_kv = plain(u.kv());
    b.unguided_rope = make_rope_tables(offsets(u.kv()), u.rope_delta(), c.T, c.d, c.rope_theta);
    b.guidance_weight = w;
  }
  backend_->bind(b);
  ctx_.emplace(std::move(ctx));
  if (opts.guidance) unguided_.emplace(opts.guidance->unguided);
}

const Captures& Session::captures() const { return backend_->captures(); }

const std::vector<StepProfile>& Session::profiles() const { return backend_->profiles(); }

size_t Session::buffer_bytes() const { return backend_->buffer_bytes(); }

namespace {

// The initial noise x_0 [B, T, A] (SampleOptions: the caller's noise, one seed per sample, or one seed), scaled by
// the temperature.
std::vector<float> initial_noise(const SampleOptions& o, const SampleResult& r) {
  const int64_t n = int64_t(r.B) * r.T * r.A;
  std::vector<float> x;
  if (!o.noise.empty()) {
    check(static_cast<int64_t>(o.noise.size()) == n, "noise: expected " + std::to_string(n) + " values [B=" +
                                                         std::to_string(r.B) + ", T=" + std::to_string(r.T) + ", A=" +
                                                         std::to_string(r.A) + "], found " + std::to_string(o.noise.size()));
    check_finite(o.noise.data(), n, "noise");
    x = o.noise;
  } else if (!o.seeds.empty()) {
    check(static_cast<int>(o.seeds.size()) == r.B, "seeds: expected one per sample (B = " + std::to_string(r.B) +
                                                       "), found " + std::to_string(o.seeds.size()));
    for (uint64_t s : o.seeds) {
      const std::vector<float> xb = gaussian_noise(s, int64_t(r.T) * r.A);
      x.insert(x.end(), xb.begin(), xb.end());
    }
  } else {
    x = gaussian_noise(o.seed.value_or(0), n);
  }
  if (o.temperature != 1.0) {
    const float temp = static_cast<float>(o.temperature);
    for (float& e : x) e = e * temp;
  }
  return x;
}

// Each sample's v0: given, from the context, or estimated from its ego history (in that order).
void resolve_v0(const SampleOptions& o, const Context& ctx, const ExpertConfig& c, SampleResult& r) {
  r.v0.resize(r.B);
  if (o.v0) {
    check_range(*o.v0, -limits::kMaxSpeed, limits::kMaxSpeed, "v0", " m/s");
    std::fill(r.v0.begin(), r.v0.end(), static_cast<float>(*o.v0));
    r.v0_source = "given";
  } else if (ctx.v0()) {
    r.v0 = *ctx.v0();
    r.v0_source = "context v0";
    for (int b = 0; b < r.B; ++b)
      check_range(r.v0[b], -limits::kMaxSpeed, limits::kMaxSpeed, ctx.name() + ": v0[" + std::to_string(b) + "]",
                  " m/s");
  } else if (ctx.history()) {
    const EgoHistory& h = *ctx.history();
    for (int b = 0; b < r.B; ++b) {
      const double v = estimate_v0(h.xyz.data() + int64_t(b) * h.H * 3, h.rot.data() + int64_t(b) * h.H * 9, h.H, c);
      check_range(v, -limits::kMaxSpeed, limits::kMaxSpeed,
                  ctx.name() + ": v0 of sample " + std::to_string(b) + " estimated from ego_history_xyz/rot (" +
                      std::to_string(h.H) + " poses, dt " + std::to_string(c.dt) + " s)",
                  " m/s");
      r.v0[b] = static_cast<float>(v);
    }
    r.v0_source = "ego history";
  } else {
    throw Error(ctx.name() + ": the context has neither v0 nor ego_history_xyz/ego_history_rot; give v0 explicitly");
  }
}

// The unicycle decode of every sample's action x into r's waypoints; refuses a non-finite waypoint.
void decode_trajectories(const std::vector<float>& x, const Context& ctx, const ExpertConfig& c, SampleResult& r) {
  r.xyz.reserve(int64_t(r.B) * r.T * 3);
  for (int b = 0; b < r.B; ++b) {
    double z = 0.0;
    if (ctx.history()) z = ctx.history()->xyz[(int64_t(b) * ctx.history()->H + ctx.history()->H - 1) * 3 + 2];
    const Trajectory tr = decode_action(x.data() + int64_t(b) * r.T * r.A, r.T, r.v0[b], z, c);
    r.xyz.insert(r.xyz.end(), tr.xyz.begin(), tr.xyz.end());
    r.yaw.insert(r.yaw.end(), tr.yaw.begin(), tr.yaw.end());
    r.rot.insert(r.rot.end(), tr.rot.begin(), tr.rot.end());
  }
  // The unicycle decode: finite actions may still overflow with a large v0, dt or action statistics.
  for (const auto& [name, v, w] : {std::tuple<const char*, const std::vector<float>*, int>{"xyz", &r.xyz, 3},
                                   {"yaw", &r.yaw, 1}, {"rot", &r.rot, 9}})
    for (size_t i = 0; i < v->size(); ++i)
      if (!std::isfinite((*v)[i])) {
        const int64_t row = int64_t(i) / w, b = row / r.T;
        throw Error(ErrorCode::NonFinite, std::string("trajectory decode: ") + name + " of sample " + std::to_string(b) + " is non-finite at waypoint " +
                    std::to_string(row % r.T) + " (the actions are finite; v0 = " + std::to_string(r.v0[b]) + " m/s, dt = " +
                    std::to_string(c.dt) + " s, accel " + std::to_string(c.accel_mean) + " + " + std::to_string(c.accel_std) +
                    " a, curvature " + std::to_string(c.curvature_mean) + " + " + std::to_string(c.curvature_std) + " k)");
      }
}

}  // namespace

SampleResult Session::sample(const SampleOptions& o) {
  check(ctx_.has_value(), ErrorCode::InvalidState, "Session::sample: no context bound (call bind first)");
  const ExpertConfig& c = model_->config();
  SampleResult r;
  r.B = ctx_->batch();
  r.T = c.T;
  r.A = c.A;
  check(o.steps >= 0 && o.steps <= 100000, "steps must be in [1, 100000], found " + std::to_string(o.steps));
  r.steps = o.steps > 0 ? o.steps : c.num_steps;
  check(r.steps >= 1 && r.steps <= 100000, "steps must be in [1, 100000], found " + std::to_string(r.steps));
  const int64_t n = int64_t(r.B) * r.T * r.A;
  check_range(o.temperature, 0, limits::kMaxTemperature, "temperature");
  const StageScope stage("sampling B " + std::to_string(r.B) + " x T " + std::to_string(r.T) + " over " +
                         std::to_string(r.steps) + " Euler steps on the " + model_->backend_name() + " backend");
  std::vector<float> x = initial_noise(o, r);
  resolve_v0(o, *ctx_, c, r);  // before the expensive sampling, so that a bad history fails first

  const std::vector<float> times = euler_time_grid(r.steps);
  if (o.all_steps) {  // every x_k and v_k: (2 N + 1) B T A floats, checked before allocating
    MemoryEstimate m;
    m.add("x_steps and v_steps over " + std::to_string(r.steps) + " steps", 4.0 * double(n) * (2.0 * r.steps + 1));
    check_memory(m, "keeping every Euler step (all_steps)");
    r.x_steps.resize(n * (r.steps + 1));
    r.v_steps.resize(n * r.steps);
  }
  DenoiseArgs a;
  a.x = x.data();
  a.times = times.data();
  a.steps = r.steps;
  a.x_steps = o.all_steps ? r.x_steps.data() : nullptr;
  a.v_steps = o.all_steps ? r.v_steps.data() : nullptr;
  a.step_seconds = &r.step_seconds;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    backend_->denoise(a);
  } catch (const NonFiniteError& e) {
    throw Error(ErrorCode::NonFinite, e.what() + layer_stage(e) + culprits(e.layer, e.unguided));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (static_cast<int>(r.step_seconds.size()) != r.steps) r.step_seconds.assign(r.steps, r.seconds / r.steps);
  check_finite(x.data(), n, "action x_N after " + std::to_string(r.steps) + " Euler steps");
  r.action = x;

  decode_trajectories(x, *ctx_, c, r);
  return r;
}

}  // namespace alpamayo
