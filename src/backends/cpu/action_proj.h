// The production action projections (docs/MATH.md section 3 and the end of section 4), fp32 on the host,
// used by the host-loop backends. Weights are transposed once to [in, out] so each output row is built
// by contiguous multiply-adds over the outputs; the reference backend's own projections
// (backends/reference/ref_action_proj.h) are the oracle they are tested against.
#pragma once
#include <vector>

#include "alpamayo/config.h"
#include "alpamayo/weights.h"
#include "backends/host_loop.h"

namespace alpamayo {

// A Linear with bias, weights held transposed [in, out].
class HostLinear {
 public:
  HostLinear() = default;
  HostLinear(const TensorView& w, const TensorView* bias);
  // y[rows, out] = x[rows, in] W^T + b
  void forward(const float* x, int rows, float* y) const;
  int in() const { return in_; }
  int out() const { return out_; }

 private:
  int in_ = 0, out_ = 0;
  std::vector<float> wt_, b_;
};

class HostProjections final : public ActionProjections {
 public:
  HostProjections(const ExpertConfig& cfg, const ModelWeights& w, bool exact_freqs);
  void in(const float* x, const float* t, int B, float* emb) const override;
  void out(const float* hidden, int rows, float* v) const override;

 private:
  int T_, A_, D_, F_;
  float eps_;  // ExpertConfig::ain_norm_eps
  std::vector<std::vector<float>> freqs_;  // A action sets then the timestep set
  std::vector<HostLinear> trunk_;          // num_enc_layers + 1
  std::vector<std::vector<float>> norm_w_;  // num_enc_layers
  std::vector<float> ln_w_, ln_b_;
  HostLinear out_;
};

}  // namespace alpamayo
