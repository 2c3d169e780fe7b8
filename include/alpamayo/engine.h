// The engine: checkpoint + backend; bind a context, then sample trajectories.
//   emb = ActionInProj(x_k, t_k); hidden = Backend.step(emb); v = ActionOutProj(hidden); x += dt v
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/checkpoint.h"
#include "alpamayo/context.h"

namespace alpamayo {

struct SampleOptions {
  int steps = 0;                        // 0: diffusion_cfg.num_inference_steps
  std::optional<uint64_t> seed{};       // noise from gaussian_noise(seed) when no noise is given
  std::vector<float> noise{};           // [B, T, A]; empty: draw from seed (0 if unset)
  bool all_steps = false;               // keep every x_k and v_k
  std::optional<double> v0{};           // overrides the context's v0 / ego-history estimate
  const LayerTap* layer_tap = nullptr;  // called for each layer during step 0 only
  std::function<void(const std::vector<float>& emb, const std::vector<float>& hidden)> step0_io{};  // step 0 I/O
  std::function<void(int step, int steps, double seconds)> progress{};
};

struct SampleResult {
  int B = 0, T = 0, A = 0, steps = 0;
  std::vector<float> action;         // [B, T, A] normalized
  std::vector<float> xyz, yaw, rot;  // [B, T, 3], [B, T], [B, T, 3, 3]
  std::vector<float> v0;             // [B]
  std::vector<float> x_steps;        // [N+1, B, T, A] when all_steps
  std::vector<float> v_steps;        // [N, B, T, A] when all_steps
  std::vector<double> step_seconds;  // wall time of each Euler step
  std::string v0_source;
};

// One engine per thread: an Engine (and its backend) is not safe to call concurrently. Engines share
// nothing, so several may run in parallel, each with its own backend threads.
class Engine {
 public:
  Engine(std::shared_ptr<const Checkpoint> ckpt, std::unique_ptr<Backend> backend, bool exact_freqs = false);
  ~Engine();
  // Checks the context against the expert and binds it to the backend (rope tables, KV cache).
  void bind(Context ctx);
  SampleResult sample(const SampleOptions& opts);

  const Checkpoint& checkpoint() const { return *ckpt_; }
  const Backend& backend() const { return *backend_; }

 private:
  struct Host;
  std::shared_ptr<const Checkpoint> ckpt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Host> host_;
  std::optional<Context> ctx_;
};

}  // namespace alpamayo
