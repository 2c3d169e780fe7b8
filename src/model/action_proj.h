// Host-side action projections (REFERENCE.md section 3 and the end of section 4), fp32.
#pragma once
#include <vector>

#include "alpamayo/checkpoint.h"

namespace alpamayo {

// torch.logspace(0, log10(max_freq), F/2), optionally rounded to bf16 as the release's buffers are.
std::vector<float> fourier_freqs(int n_fourier, double max_freq, bool round_bf16);

// Fourier(z) = sqrt(2) [sin(2 pi f z), cos(2 pi f z)] written to out[0 .. 2*freqs.size()).
void fourier_features(float z, const std::vector<float>& freqs, float* out);

class ActionInProj {
 public:
  // exact_freqs: compute unrounded frequencies when the checkpoint has no buffers.
  ActionInProj(const ExpertConfig& cfg, const ActionInProjWeights& w, bool exact_freqs = false);
  // x [B, T, A], t [B] -> embeddings [B, T, D].
  void forward(const float* x, const float* t, int B, float* out) const;
  const std::vector<std::vector<float>>& freqs() const { return freqs_; }

 private:
  int T_, A_, D_, h_, F_;
  std::vector<std::vector<float>> freqs_;  // A action sets then the timestep set
  std::vector<std::vector<float>> lw_, lb_, nw_;
  std::vector<int> lin_out_, lin_in_;
  std::vector<float> ln_w_, ln_b_;
};

class ActionOutProj {
 public:
  explicit ActionOutProj(const ActionOutProjWeights& w);
  // hidden [rows, D] -> v [rows, A].
  void forward(const float* hidden, int rows, float* v) const;

 private:
  int A_, D_;
  std::vector<float> w_, b_;
};

}  // namespace alpamayo
