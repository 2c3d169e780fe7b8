#include "backends/host_loop.h"

#include <chrono>
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

void HostLoopSession::denoise(const DenoiseArgs& a) {
  const int64_t n = int64_t(B_) * cfg_.T * cfg_.A;
  std::vector<float*> layer_ptrs;
  for (auto& l : cap_.layers) layer_ptrs.push_back(l.data());
  cap_.step = -1;
  float* x = a.x;
  if (a.x_steps) std::copy(x, x + n, a.x_steps);
  for (int k = 0; k < a.steps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(t_.begin(), t_.end(), a.times[k]);
    const float dt = a.times[k + 1] - a.times[k];
    const bool capture = k == req_.step;
    proj_.in(x, t_.data(), B_, emb_.data());
    step(emb_.data(), hidden_.data(), capture && req_.layers ? layer_ptrs.data() : nullptr);
    if (capture) {
      cap_.emb = emb_;
      cap_.hidden = hidden_;
      cap_.step = k;
    }
    proj_.out(hidden_.data(), B_ * cfg_.T, v_.data());
    if (unguided_) {
      // NVlabs/alpamayo1.5 FlowMatching._guided_v: (1 - w) * unguided_v + w * guided_v, fp32 products.
      unguided_->step(emb_.data(), hidden_u_.data(), nullptr);
      proj_.out(hidden_u_.data(), B_ * cfg_.T, v_u_.data());
      const float wu = static_cast<float>(1.0 - weight_), wg = static_cast<float>(weight_);
      for (int64_t i = 0; i < n; ++i) v_[i] = wu * v_u_[i] + wg * v_[i];
    }
    for (int64_t i = 0; i < n; ++i)
      check(std::isfinite(v_[i]), "velocity at Euler step " + std::to_string(k) + ": non-finite value " +
                                      std::to_string(v_[i]) + " at flat index " + std::to_string(i));
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] + dt * v_[i];
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
