#include "backends/reference/ref_action_proj.h"

#include <cmath>

#include "alpamayo/error.h"
#include "backends/reference/ops.h"
#include "model/fourier.h"

namespace alpamayo::ref {

ActionInProj::ActionInProj(const ExpertConfig& cfg, const ActionInProjWeights& w, bool exact_freqs)
    : T_(cfg.T), A_(cfg.A), D_(cfg.D), h_(cfg.ain_hidden), F_(cfg.n_fourier), eps_(cfg.ain_norm_eps) {
  if (w.freqs.empty()) {
    freqs_.assign(A_ + 1, fourier_freqs(F_, cfg.max_freq, !exact_freqs));
  } else {
    for (const TensorView& f : w.freqs) freqs_.push_back(to_f32(f));
  }
  for (size_t i = 0; i < w.linear_w.size(); ++i) {
    lw_.push_back(to_f32(w.linear_w[i]));
    lb_.push_back(to_f32(w.linear_b[i]));
    lin_out_.push_back(static_cast<int>(w.linear_w[i].shape[0]));
    lin_in_.push_back(static_cast<int>(w.linear_w[i].shape[1]));
  }
  for (const TensorView& n : w.norm_w) nw_.push_back(to_f32(n));
  ln_w_ = to_f32(w.ln_w);
  ln_b_ = to_f32(w.ln_b);
}

void ActionInProj::forward(const float* x, const float* t, int B, float* out) const {
  const int M = B * T_, in0 = (A_ + 1) * F_;
  std::vector<float> feats(int64_t(M) * in0), a, b;
  for (int bi = 0; bi < B; ++bi)
    for (int k = 0; k < T_; ++k) {
      float* fr = feats.data() + (int64_t(bi) * T_ + k) * in0;
      for (int i = 0; i < A_; ++i) fourier_features(x[(int64_t(bi) * T_ + k) * A_ + i], freqs_[i], fr + i * F_);
      fourier_features(t[bi], freqs_[A_], fr + A_ * F_);
    }
  // trunk: Linear, SiLU, then per encoder layer RMSNorm(eps cfg.ain_norm_eps), Linear (+ SiLU except the last).
  auto linear = [&](size_t i, const std::vector<float>& src, std::vector<float>& dst) {
    dst.resize(int64_t(M) * lin_out_[i]);
    matmul_nt(src.data(), M, lin_in_[i], lw_[i].data(), lin_out_[i], dst.data());
    for (int m = 0; m < M; ++m)
      for (int o = 0; o < lin_out_[i]; ++o) dst[int64_t(m) * lin_out_[i] + o] += lb_[i][o];
  };
  auto silu_all = [](std::vector<float>& v) { for (float& e : v) e = silu(e); };
  linear(0, feats, a);
  silu_all(a);
  for (size_t i = 0; i < nw_.size(); ++i) {
    rms_norm(a.data(), nw_[i].data(), M, h_, eps_, a.data());
    linear(i + 1, a, b);
    if (i + 1 < nw_.size()) silu_all(b);
    a.swap(b);
  }
  // LayerNorm(D, eps cfg.ain_norm_eps) with weight and bias (biased variance, as torch).
  for (int m = 0; m < M; ++m) {
    const float* r = a.data() + int64_t(m) * D_;
    float mean = 0.f, var = 0.f;
    for (int i = 0; i < D_; ++i) mean += r[i];
    mean /= D_;
    for (int i = 0; i < D_; ++i) var += (r[i] - mean) * (r[i] - mean);
    var /= D_;
    const float inv = 1.0f / std::sqrt(var + eps_);
    float* o = out + int64_t(m) * D_;
    for (int i = 0; i < D_; ++i) o[i] = (r[i] - mean) * inv * ln_w_[i] + ln_b_[i];
  }
}

ActionOutProj::ActionOutProj(const ActionOutProjWeights& w)
    : A_(static_cast<int>(w.w.shape[0])), D_(static_cast<int>(w.w.shape[1])), w_(to_f32(w.w)), b_(to_f32(w.b)) {}

void ActionOutProj::forward(const float* hidden, int rows, float* v) const {
  matmul_nt(hidden, rows, D_, w_.data(), A_, v);
  for (int r = 0; r < rows; ++r)
    for (int a = 0; a < A_; ++a) v[int64_t(r) * A_ + a] += b_[a];
}

}  // namespace alpamayo::ref
