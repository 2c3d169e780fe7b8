#include "alpamayo/engine.h"

#include <chrono>
#include <cmath>

#include "alpamayo/action_space.h"
#include "alpamayo/error.h"
#include "model/action_proj.h"
#include "model/sampler.h"

namespace alpamayo {

struct Engine::Host {
  ActionInProj in;
  ActionOutProj out;
};

Engine::Engine(std::shared_ptr<const Checkpoint> ckpt, std::unique_ptr<Backend> backend, bool exact_freqs)
    : ckpt_(std::move(ckpt)), backend_(std::move(backend)) {
  const ExpertConfig& c = ckpt_->config();
  host_ = std::make_unique<Host>(Host{ActionInProj(c, ckpt_->action_in(), exact_freqs), ActionOutProj(ckpt_->action_out())});
  backend_->load(c, ckpt_->expert());
}

Engine::~Engine() = default;

void Engine::bind(Context ctx) {
  const ExpertConfig& c = ckpt_->config();
  ctx.check_compatible(c);
  ctx_.emplace(std::move(ctx));
  const KVCache& kv = ctx_->kv();
  backend_->bind(kv, make_rope_tables(kv.valid_len, ctx_->rope_delta(), c.T, c.d, c.rope_theta));
}

SampleResult Engine::sample(const SampleOptions& o) {
  check(ctx_.has_value(), "Engine::sample: no context bound (call bind first)");
  const ExpertConfig& c = ckpt_->config();
  SampleResult r;
  r.B = ctx_->batch();
  r.T = c.T;
  r.A = c.A;
  r.steps = o.steps > 0 ? o.steps : c.num_steps;
  check(o.steps >= 0 && r.steps <= 100000, "steps must be in [1, 100000], found " + std::to_string(o.steps));
  const int64_t n = int64_t(r.B) * r.T * r.A;
  std::vector<float> x;
  if (!o.noise.empty()) {
    check(static_cast<int64_t>(o.noise.size()) == n, "noise: expected " + std::to_string(n) + " values [B=" +
                                                         std::to_string(r.B) + ", T=" + std::to_string(r.T) + ", A=" +
                                                         std::to_string(r.A) + "], found " + std::to_string(o.noise.size()));
    check_finite(o.noise.data(), n, "noise");
    x = o.noise;
  } else {
    x = gaussian_noise(o.seed.value_or(0), n);
  }

  // v0 first, so that a bad history fails before the expensive sampling.
  r.v0.resize(r.B);
  if (o.v0) {
    check(std::isfinite(*o.v0), "v0 must be finite");
    std::fill(r.v0.begin(), r.v0.end(), static_cast<float>(*o.v0));
    r.v0_source = "given";
  } else if (ctx_->v0()) {
    r.v0 = *ctx_->v0();
    r.v0_source = "context v0";
  } else if (ctx_->history()) {
    const EgoHistory& h = *ctx_->history();
    for (int b = 0; b < r.B; ++b)
      r.v0[b] = static_cast<float>(estimate_v0(h.xyz.data() + int64_t(b) * h.H * 3, h.rot.data() + int64_t(b) * h.H * 9, h.H, c));
    r.v0_source = "ego history";
  } else {
    throw Error(ctx_->name() + ": the context has neither v0 nor ego_history_xyz/ego_history_rot; give v0 explicitly");
  }

  const std::vector<float> times = euler_time_grid(r.steps);
  std::vector<float> emb(int64_t(r.B) * r.T * c.D), hidden(emb.size()), v(n), t(r.B);
  if (o.all_steps) {
    r.x_steps.reserve(n * (r.steps + 1));
    r.x_steps.insert(r.x_steps.end(), x.begin(), x.end());
    r.v_steps.reserve(n * r.steps);
  }
  for (int k = 0; k < r.steps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(t.begin(), t.end(), times[k]);
    const float dt = times[k + 1] - times[k];
    host_->in.forward(x.data(), t.data(), r.B, emb.data());
    backend_->step(emb.data(), hidden.data(), k == 0 ? o.layer_tap : nullptr);
    if (k == 0 && o.step0_io) o.step0_io(emb, hidden);
    host_->out.forward(hidden.data(), r.B * r.T, v.data());
    check_finite(v.data(), n, "velocity at Euler step " + std::to_string(k));
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] + dt * v[i];
    if (o.all_steps) {
      r.v_steps.insert(r.v_steps.end(), v.begin(), v.end());
      r.x_steps.insert(r.x_steps.end(), x.begin(), x.end());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.step_seconds.push_back(secs);
    if (o.progress) o.progress(k, r.steps, secs);
  }
  r.action = x;

  r.xyz.reserve(int64_t(r.B) * r.T * 3);
  for (int b = 0; b < r.B; ++b) {
    double z = 0.0;
    if (ctx_->history()) z = ctx_->history()->xyz[(int64_t(b) * ctx_->history()->H + ctx_->history()->H - 1) * 3 + 2];
    const Trajectory tr = decode_action(x.data() + int64_t(b) * r.T * r.A, r.T, r.v0[b], z, c);
    r.xyz.insert(r.xyz.end(), tr.xyz.begin(), tr.xyz.end());
    r.yaw.insert(r.yaw.end(), tr.yaw.begin(), tr.yaw.end());
    r.rot.insert(r.rot.end(), tr.rot.begin(), tr.rot.end());
  }
  return r;
}

}  // namespace alpamayo
