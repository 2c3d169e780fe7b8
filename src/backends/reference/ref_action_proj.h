// The reference backend's action projections (docs/MATH.md section 3 and the end of section 4): plain
// fp32 over the reference ops, the oracle for the production projections in src/backends/cpu/action_proj.h.
#pragma once
#include <vector>

#include "alpamayo/config.h"
#include "alpamayo/weights.h"
#include "backends/host_loop.h"

namespace alpamayo::ref {

class ActionInProj {
 public:
  // exact_freqs: compute unrounded frequencies when the checkpoint has no buffers.
  ActionInProj(const ExpertConfig& cfg, const ActionInProjWeights& w, bool exact_freqs = false);
  // x [B, T, A], t [B] -> embeddings [B, T, D].
  void forward(const float* x, const float* t, int B, float* out) const;
  const std::vector<std::vector<float>>& freqs() const { return freqs_; }

 private:
  int T_, A_, D_, h_, F_;
  float eps_;  // ExpertConfig::ain_norm_eps
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

class Projections final : public ActionProjections {
 public:
  Projections(const ExpertConfig& cfg, const ModelWeights& w, bool exact_freqs)
      : in_(cfg, w.action_in, exact_freqs), out_(w.action_out) {}
  void in(const float* x, const float* t, int B, float* emb) const override { in_.forward(x, t, B, emb); }
  void out(const float* hidden, int rows, float* v) const override { out_.forward(hidden, rows, v); }

 private:
  ActionInProj in_;
  ActionOutProj out_;
};

}  // namespace alpamayo::ref
