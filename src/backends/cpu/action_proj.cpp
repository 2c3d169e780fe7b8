#include "backends/cpu/action_proj.h"

#include <algorithm>
#include <cmath>

#include "model/fourier.h"

namespace alpamayo {

HostLinear::HostLinear(const TensorView& w, const TensorView* bias)
    : in_(static_cast<int>(w.shape[1])), out_(static_cast<int>(w.shape[0])) {
  const std::vector<float> rows = to_f32(w);
  wt_.resize(rows.size());
  for (int o = 0; o < out_; ++o)
    for (int i = 0; i < in_; ++i) wt_[size_t(i) * out_ + o] = rows[size_t(o) * in_ + i];
  b_ = bias ? to_f32(*bias) : std::vector<float>(out_, 0.f);
}

void HostLinear::forward(const float* x, int rows, float* y) const {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * in_;
    float* yr = y + size_t(r) * out_;
    std::fill(yr, yr + out_, 0.f);
    for (int i = 0; i < in_; ++i) {
      const float xi = xr[i];
      const float* w = wt_.data() + size_t(i) * out_;
#pragma omp simd
      for (int o = 0; o < out_; ++o) yr[o] += xi * w[o];
    }
    for (int o = 0; o < out_; ++o) yr[o] += b_[o];
  }
}

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// In-place RMSNorm of rows of width n with weight w (the trunk's eps, ExpertConfig::ain_norm_eps).
void rms_norm_inplace(float* x, int rows, int n, const float* w, float eps) {
  for (int r = 0; r < rows; ++r) {
    float* xr = x + size_t(r) * n;
    float ss = 0.f;
    for (int i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) xr[i] = w[i] * (xr[i] * inv);
  }
}

}  // namespace

HostProjections::HostProjections(const ExpertConfig& cfg, const ModelWeights& w, bool exact_freqs)
    : T_(cfg.T), A_(cfg.A), D_(cfg.D), F_(cfg.n_fourier), eps_(cfg.ain_norm_eps), out_(w.action_out.w, &w.action_out.b) {
  const ActionInProjWeights& a = w.action_in;
  if (a.freqs.empty()) {
    freqs_.assign(A_ + 1, fourier_freqs(F_, cfg.max_freq, !exact_freqs));
  } else {
    for (const TensorView& f : a.freqs) freqs_.push_back(to_f32(f));
  }
  for (size_t i = 0; i < a.linear_w.size(); ++i) trunk_.emplace_back(a.linear_w[i], &a.linear_b[i]);
  for (const TensorView& n : a.norm_w) norm_w_.push_back(to_f32(n));
  ln_w_ = to_f32(a.ln_w);
  ln_b_ = to_f32(a.ln_b);
}

void HostProjections::in(const float* x, const float* t, int B, float* emb) const {
  const int M = B * T_, width0 = (A_ + 1) * F_;
  std::vector<float> cur(size_t(M) * width0), next;
  for (int m = 0; m < M; ++m) {
    float* f = cur.data() + size_t(m) * width0;
    for (int i = 0; i < A_; ++i) fourier_features(x[size_t(m) * A_ + i], freqs_[i], f + i * F_);
    fourier_features(t[m / T_], freqs_[A_], f + A_ * F_);
  }
  // trunk: Linear, SiLU, then per encoder layer RMSNorm(ain_norm_eps), Linear (+ SiLU except after the last).
  for (size_t i = 0; i < trunk_.size(); ++i) {
    if (i > 0) rms_norm_inplace(cur.data(), M, trunk_[i].in(), norm_w_[i - 1].data(), eps_);
    next.resize(size_t(M) * trunk_[i].out());
    trunk_[i].forward(cur.data(), M, next.data());
    if (i + 1 < trunk_.size())
      for (float& e : next) e = silu(e);
    cur.swap(next);
  }
  // LayerNorm(D, ain_norm_eps), biased variance as torch; two passes over each row.
  for (int m = 0; m < M; ++m) {
    const float* r = cur.data() + size_t(m) * D_;
    float sum = 0.f;
    for (int i = 0; i < D_; ++i) sum += r[i];
    const float mean = sum / D_;
    float sq = 0.f;
    for (int i = 0; i < D_; ++i) sq += (r[i] - mean) * (r[i] - mean);
    const float inv = 1.0f / std::sqrt(sq / D_ + eps_);
    float* o = emb + size_t(m) * D_;
    for (int i = 0; i < D_; ++i) o[i] = (r[i] - mean) * inv * ln_w_[i] + ln_b_[i];
  }
}

void HostProjections::out(const float* hidden, int rows, float* v) const { out_.forward(hidden, rows, v); }

}  // namespace alpamayo
