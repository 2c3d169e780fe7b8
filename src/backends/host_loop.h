// The host loop shared by backends that run one denoising step at a time on the host (reference, cpu):
// the Euler loop, the action projections and the debug captures, so such a backend only implements
// bind_step() and step(). A device backend derives from BackendSession directly and runs the loop itself.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/backend.h"

namespace alpamayo {

// action_in_proj and action_out_proj with weights converted once (held by a backend's model).
class ActionProjections {
 public:
  virtual ~ActionProjections() = default;
  // x [B, T, A] at time t [B] -> embeddings [B, T, D].
  virtual void in(const float* x, const float* t, int B, float* emb) const = 0;
  // hidden [rows, D] -> velocity [rows, A].
  virtual void out(const float* hidden, int rows, float* v) const = 0;
};

class HostLoopSession : public BackendSession {
 public:
  HostLoopSession(const ExpertConfig& cfg, const ActionProjections& proj) : cfg_(cfg), proj_(proj) {}
  void bind(const Binding& b) final;
  // for k < N: emb = in(x, t_k); hidden = step(emb); v = out(hidden); x += (t_{k+1} - t_k) v, with guidance
  // v = (1 - w) out(step_unguided(emb)) + w v (the same emb: x and t do not depend on the context)
  void denoise(const DenoiseArgs& a) final;
  const Captures& captures() const final { return cap_; }
  size_t buffer_bytes() const final;
  const std::vector<StepProfile>& profiles() const final { return profiles_; }

 protected:
  // Sizes every buffer of step() for this binding.
  virtual void bind_step(const Binding& b) = 0;
  // emb [B, T, D] -> final-normed hidden [B, T, D]. layers: null, or L pointers receiving each layer's
  // output [B, T, D] (the captured step).
  virtual void step(const float* emb, float* hidden, float* const* layers) = 0;
  virtual size_t step_buffer_bytes() const = 0;
  // An unbound session of the same model, for the unguided pass of classifier-free guidance.
  virtual std::unique_ptr<HostLoopSession> new_sibling() const = 0;
  // The profile of the last step(), where the backend records one; nullptr otherwise.
  virtual const StepProfile* step_profile() const { return nullptr; }

  const ExpertConfig& cfg_;

 private:
  // Throws NonFiniteError naming the first stage of Euler step k (time t, input x) with a non-finite output.
  [[noreturn]] void non_finite(int k, float t, const float* x);
  std::string at(int64_t i, int width) const;
  const ActionProjections& proj_;
  int B_ = 0;
  CaptureRequest req_;
  Captures cap_;
  std::vector<float> emb_, hidden_, v_, t_;
  // Guidance: the unguided context bound to a sibling session, its hidden state and velocity.
  std::unique_ptr<HostLoopSession> unguided_;
  double weight_ = 1.0;
  std::vector<float> hidden_u_, v_u_;
  std::vector<StepProfile> profiles_;  // of the last denoise
};

}  // namespace alpamayo
