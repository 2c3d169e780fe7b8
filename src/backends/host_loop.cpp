#include "backends/host_loop.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <cmath>
#include <string>

#include "alpamayo/error.h"

namespace alpamayo {

void HostLoopSession::bind(const Binding& b) {
  B_ = b.kv.B;
  req_ = b.capture;
  const size_t n = size_t(B_) * cfg_.T * cfg_.D;
  emb_.assign(n, 0.f);
  hidden_.assign(n, 0.f);
  v_.assign(size_t(B_) * cfg_.T * cfg_.A, 0.f);
  t_.assign(B_, 0.f);
  cap_ = Captures{};
  if (req_.step >= 0) {
    cap_.emb.assign(n, 0.f);
    cap_.hidden.assign(n, 0.f);
    if (req_.layers) cap_.layers.assign(cfg_.L, std::vector<float>(n, 0.f));
  }
  unguided_.reset();
  hidden_u_.clear();
  v_u_.clear();
  if (b.guided) {
    unguided_ = new_sibling();
    Binding u;
    u.kv = b.unguided_kv;
    u.rope = b.unguided_rope;
    unguided_->B_ = B_;
    unguided_->bind_step(u);
    weight_ = b.guidance_weight;
    hidden_u_.assign(n, 0.f);
    v_u_.assign(v_.size(), 0.f);
  }
  bind_step(b);
}

namespace {

int64_t first_non_finite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}

// The largest magnitude among the finite values.
float max_abs(const float* p, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(p[i])) m = std::max(m, std::fabs(p[i]));
  return m;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

// Flat index i of a [B, T, width] array as "[sample b, waypoint t, channel c]".
std::string HostLoopSession::at(int64_t i, int width) const {
  const int64_t row = i / width;
  return "[sample " + std::to_string(row / cfg_.T) + ", waypoint " + std::to_string(row % cfg_.T) + ", " +
         std::to_string(i % width) + "]";
}

// A velocity of Euler step k is non-finite: re-run the step with every stage's output kept and name the first
// stage whose output is non-finite, with the largest finite value of its input (an overflow shows as a
// finite input of huge magnitude; a NaN/Inf weight or cache as a moderate one). Costs one extra step, on
// the failure path only.
void HostLoopSession::non_finite(int k, float t, const float* x) {
  const int64_t rows = int64_t(B_) * cfg_.T, nh = rows * cfg_.D, nv = rows * cfg_.A;
  const std::string of = " of Euler step " + std::to_string(k) + " (t = " + num(t) + ")";
  const std::string in_x = "its input x_" + std::to_string(k) + " is finite (max |x| = " + num(max_abs(x, nv)) + ")";
  if (const int64_t i = first_non_finite(emb_.data(), nh); i >= 0)
    throw NonFiniteError("action_in_proj output (the action-token embeddings)" + of + " is non-finite at " +
                             at(i, cfg_.D) + "; " + in_x,
                         k, -1);
  std::vector<std::vector<float>> outs;
  std::vector<float*> ptrs;
  std::vector<float> hid, v;
  try {  // L + 1 hidden states: on the failure path only, and never at the cost of the error it explains
    outs.assign(cfg_.L, std::vector<float>(nh));
    hid.resize(nh);
    v.resize(nv);
  } catch (const std::bad_alloc&) {
    const int64_t i = first_non_finite(v_.data(), nv);
    throw NonFiniteError("velocity" + of + " is non-finite at " + at(i, cfg_.A) +
                             " (not traced to a layer: no memory for the re-run keeping every layer's output)",
                         k, -1);
  }
  for (auto& o : outs) ptrs.push_back(o.data());
  auto pass = [&](HostLoopSession& s, const std::string& which, bool unguided) {
    s.step(emb_.data(), hid.data(), ptrs.data());
    float prev = max_abs(emb_.data(), nh);
    for (int l = 0; l < cfg_.L; ++l) {
      if (const int64_t i = first_non_finite(outs[l].data(), nh); i >= 0)
        throw NonFiniteError("layer " + std::to_string(l) + " output" + which + of + " is non-finite at " +
                                 at(i, cfg_.D) + "; its input (" +
                                 (l ? "layer " + std::to_string(l - 1) + " output" : std::string("the embeddings")) +
                                 ") is finite, max |value| = " + num(prev),
                             k, l, l ? outs[l - 1] : emb_, unguided);
      prev = max_abs(outs[l].data(), nh);
    }
    if (const int64_t i = first_non_finite(hid.data(), nh); i >= 0)
      throw NonFiniteError("the final norm output" + which + of + " is non-finite at " + at(i, cfg_.D) +
                               "; its input (layer " + std::to_string(cfg_.L - 1) + " output) is finite, max |value| = " +
                               num(prev),
                           k, -1);
    proj_.out(hid.data(), static_cast<int>(rows), v.data());
    if (const int64_t i = first_non_finite(v.data(), nv); i >= 0)
      throw NonFiniteError("action_out_proj output (the velocity)" + which + of + " is non-finite at " +
                               at(i, cfg_.A) + "; its input (the final hidden state) is finite, max |value| = " +
                               num(max_abs(hid.data(), nh)),
                           k, -1);
  };
  pass(*this, unguided_ ? " of the guided pass" : "", false);
  if (unguided_) {
    pass(*unguided_, " of the unguided pass", true);
    throw NonFiniteError("the guided velocity (1 - w) v_unguided + w v_guided" + of + " overflows (w = " +
                             num(weight_) + "; both passes are finite)",
                         k, -1);
  }
  const int64_t i = first_non_finite(v_.data(), nv);
  throw NonFiniteError("velocity" + of + " is non-finite at " + at(i, cfg_.A) +
                           " (not reproduced when the step was re-run stage by stage)",
                       k, -1);
}

void HostLoopSession::denoise(const DenoiseArgs& a) {
  const int64_t n = int64_t(B_) * cfg_.T * cfg_.A;
  std::vector<float*> layer_ptrs;
  for (auto& l : cap_.layers) layer_ptrs.push_back(l.data());
  cap_.step = -1;
  profiles_.clear();
  auto keep_profile = [&](const HostLoopSession& s) {
    if (const StepProfile* p = s.step_profile()) profiles_.push_back(*p);
  };
  float* x = a.x;
  if (a.x_steps) std::copy(x, x + n, a.x_steps);
  for (int k = 0; k < a.steps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(t_.begin(), t_.end(), a.times[k]);
    const float dt = a.times[k + 1] - a.times[k];
    const bool capture = k == req_.step;
    proj_.in(x, t_.data(), B_, emb_.data());
    step(emb_.data(), hidden_.data(), capture && req_.layers ? layer_ptrs.data() : nullptr);
    keep_profile(*this);
    if (capture) {
      cap_.emb = emb_;
      cap_.hidden = hidden_;
      cap_.step = k;
    }
    proj_.out(hidden_.data(), B_ * cfg_.T, v_.data());
    if (unguided_) {
      // NVlabs/alpamayo1.5 FlowMatching._guided_v: (1 - w) * unguided_v + w * guided_v, fp32 products.
      unguided_->step(emb_.data(), hidden_u_.data(), nullptr);
      keep_profile(*unguided_);
      proj_.out(hidden_u_.data(), B_ * cfg_.T, v_u_.data());
      const float wu = static_cast<float>(1.0 - weight_), wg = static_cast<float>(weight_);
      for (int64_t i = 0; i < n; ++i) v_[i] = wu * v_u_[i] + wg * v_[i];
    }
    if (first_non_finite(v_.data(), n) >= 0) non_finite(k, a.times[k], x);
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] + dt * v_[i];
    if (const int64_t i = first_non_finite(x, n); i >= 0)
      throw NonFiniteError("the action x_" + std::to_string(k + 1) + " = x_" + std::to_string(k) + " + dt * v_" +
                               std::to_string(k) + " overflows at " + at(i, cfg_.A) + " (every velocity of Euler step " +
                               std::to_string(k) + " is finite; max |v| = " + num(max_abs(v_.data(), n)) + ")",
                           k, -1);
    if (a.v_steps) std::copy(v_.begin(), v_.end(), a.v_steps + k * n);
    if (a.x_steps) std::copy(x, x + n, a.x_steps + (k + 1) * n);
    if (a.step_seconds)
      a.step_seconds->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

size_t HostLoopSession::buffer_bytes() const {
  size_t f = emb_.size() + hidden_.size() + v_.size() + t_.size() + cap_.emb.size() + cap_.hidden.size() +
             hidden_u_.size() + v_u_.size();
  for (const auto& l : cap_.layers) f += l.size();
  return f * sizeof(float) + step_buffer_bytes() + (unguided_ ? unguided_->step_buffer_bytes() : 0);
}

}  // namespace alpamayo
