// A session: one bound context on a shared Model; samples trajectories.
//   x_0 (noise or seed) -> backend denoise (N Euler steps of v = expert(x_k, t_k)) -> x_N -> unicycle decode
// Every input is validated here, once, before the backend sees it (docs/ARCHITECTURE.md).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/context.h"
#include "alpamayo/model.h"

namespace alpamayo {

// Classifier-free guidance (Alpamayo 1.5's navigation guidance): the unguided context, built from the
// prompt without the navigation text, and the weight w of v = (1 - w) v_unguided + w v_guided.
struct Guidance {
  Context unguided;
  double weight = 1.0;
};

struct BindOptions {
  CaptureRequest capture{};          // debug captures of one Euler step, read back with Session::captures()
  std::optional<Guidance> guidance{};  // same samples and layers as the bound context
};

struct SampleOptions {
  int steps = 0;                   // 0: diffusion_cfg.num_inference_steps; else 1..100000
  // Initial noise, the first given of: the caller's noise [B, T, A]; one seed per sample (sample b from
  // gaussian_noise(seeds[b], T*A), reproducible alone); one seed for the batch (gaussian_noise(seed, B*T*A));
  // seed 0.
  std::vector<float> noise{};
  std::vector<uint64_t> seeds{};
  std::optional<uint64_t> seed{};
  double temperature = 1.0;        // the initial noise is multiplied by it (fp32), as the release does
  bool all_steps = false;          // keep every x_k and v_k
  std::optional<double> v0{};      // overrides the context's v0 / ego-history estimate
};

struct SampleResult {
  int B = 0, T = 0, A = 0, steps = 0;
  std::vector<float> action;         // [B, T, A] normalized
  std::vector<float> xyz, yaw, rot;  // [B, T, 3], [B, T], [B, T, 3, 3]
  std::vector<float> v0;             // [B]
  std::vector<float> x_steps;        // [N+1, B, T, A] when all_steps
  std::vector<float> v_steps;        // [N, B, T, A] when all_steps
  std::vector<double> step_seconds;  // wall time of each Euler step (host-loop backends; else the mean)
  double seconds = 0;                // wall time of the whole denoising loop
  std::string v0_source;
};

// Not safe to call concurrently on one Session; different Sessions (of one Model or several) run in
// parallel. Results do not depend on what other sessions run.
class Session {
 public:
  explicit Session(std::shared_ptr<const Model> model);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Validates the context (and a guidance context) against the model (layer count, heads, head dim, every
  // tensor's shape, dtype and device, lengths, v0 and ego-history sizes, finite cache rows in use) and
  // binds it. A context of other sizes may be bound at any time; a failed bind leaves the session unbound.
  void bind(Context ctx, const BindOptions& opts = {});
  bool bound() const { return ctx_.has_value(); }
  const Context& context() const;

  SampleResult sample(const SampleOptions& opts);
  // The captures of the last sample (step -1 when none were requested at bind).
  const Captures& captures() const;
  // The per-step profiles of the last sample (BackendOptions::profile; backend.h, StepProfile): empty where
  // profiling is off or the backend does not profile.
  const std::vector<StepProfile>& profiles() const;

  const Model& model() const { return *model_; }
  size_t buffer_bytes() const;

 private:
  // For a non-finite layer output: the operation inside the layer, and what the layer reads with non-finite or
  // the largest values.
  std::string layer_stage(const NonFiniteError& e) const;
  std::string culprits(int layer, bool unguided) const;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<BackendSession> backend_;
  std::optional<Context> ctx_, unguided_;
};

}  // namespace alpamayo
