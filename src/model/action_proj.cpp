#include "model/action_proj.h"

#include <cmath>

#include "alpamayo/error.h"
#include "backends/reference/ops.h"

namespace alpamayo {

std::vector<float> fourier_freqs(int n_fourier, double max_freq, bool round_bf16) {
  const int half = n_fourier / 2;
  const double end = std::log10(max_freq);
  std::vector<float> f(half);
  for (int j = 0; j < half; ++j) {
    const double e = half > 1 ? end * j / (half - 1) : 0.0;
    const float v = static_cast<float>(std::pow(10.0, e));
    f[j] = round_bf16 ? bf16_round(v) : v;
  }
  return f;
}

void fourier_features(float z, const std::vector<float>& freqs, float* out) {
  // Same operation order as the release: ((z * f) * 2) * pi, in fp32.
  const float two_pi_order_pi = static_cast<float>(M_PI), sqrt2 = static_cast<float>(std::sqrt(2.0));
  const size_t h = freqs.size();
  for (size_t j = 0; j < h; ++j) {
    const float arg = ((z * freqs[j]) * 2.0f) * two_pi_order_pi;
    out[j] = std::sin(arg) * sqrt2;
    out[h + j] = std::cos(arg) * sqrt2;
  }
}

ActionInProj::ActionInProj(const ExpertConfig& cfg, const ActionInProjWeights& w, bool exact_freqs)
    : T_(cfg.T), A_(cfg.A), D_(cfg.D), h_(cfg.ain_hidden), F_(cfg.n_fourier) {
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
  // trunk: Linear, SiLU, then per encoder layer RMSNorm(eps 1e-5), Linear (+ SiLU except the last).
  auto linear = [&](size_t i, const std::vector<float>& src, std::vector<float>& dst) {
    dst.resize(int64_t(M) * lin_out_[i]);
    ref::matmul_nt(src.data(), M, lin_in_[i], lw_[i].data(), lin_out_[i], dst.data());
    for (int m = 0; m < M; ++m)
      for (int o = 0; o < lin_out_[i]; ++o) dst[int64_t(m) * lin_out_[i] + o] += lb_[i][o];
  };
  auto silu = [](std::vector<float>& v) { for (float& e : v) e = ref::silu(e); };
  linear(0, feats, a);
  silu(a);
  for (size_t i = 0; i < nw_.size(); ++i) {
    ref::rms_norm(a.data(), nw_[i].data(), M, h_, 1e-5, a.data());
    linear(i + 1, a, b);
    if (i + 1 < nw_.size()) silu(b);
    a.swap(b);
  }
  // LayerNorm(D, eps 1e-5) with weight and bias (biased variance, as torch).
  for (int m = 0; m < M; ++m) {
    const float* r = a.data() + int64_t(m) * D_;
    float mean = 0.f, var = 0.f;
    for (int i = 0; i < D_; ++i) mean += r[i];
    mean /= D_;
    for (int i = 0; i < D_; ++i) var += (r[i] - mean) * (r[i] - mean);
    var /= D_;
    const float inv = 1.0f / std::sqrt(var + 1e-5f);
    float* o = out + int64_t(m) * D_;
    for (int i = 0; i < D_; ++i) o[i] = (r[i] - mean) * inv * ln_w_[i] + ln_b_[i];
  }
}

ActionOutProj::ActionOutProj(const ActionOutProjWeights& w)
    : A_(static_cast<int>(w.w.shape[0])), D_(static_cast<int>(w.w.shape[1])), w_(to_f32(w.w)), b_(to_f32(w.b)) {}

void ActionOutProj::forward(const float* hidden, int rows, float* v) const {
  ref::matmul_nt(hidden, rows, D_, w_.data(), A_, v);
  for (int r = 0; r < rows; ++r)
    for (int a = 0; a < A_; ++a) v[int64_t(r) * A_ + a] += b_[a];
}

}  // namespace alpamayo
