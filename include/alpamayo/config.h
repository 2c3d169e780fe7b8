// The expert's configuration: sizes derived from the checkpoint's tensors, checked against config.json;
// every other value read from where the checkpoint's release keeps it (docs/FORMATS.md).
#pragma once
#include <string>
#include <vector>

namespace alpamayo {

// The Alpamayo releases whose config.json the engine reads, each recognised by its model_type /
// architectures (or named by the user when a fork renamed them).
enum class Release {
  R1,       // Alpamayo-R1 (Alpamayo 1): model_type alpamayo_r1, flat *_cfg keys, buffers in the checkpoint
  A1_5,     // Alpamayo 1.5: model_type alpamayo1_5, flat *_cfg keys, no persistent buffers
  A2Super,  // Alpamayo 2 Super: model_type alpamayo2_super, everything under expert_config / vlm_config
};

// One configuration value and where it came from: a config key ("config.json expert_config.diffusion_cfg.
// num_inference_steps"), a tensor, or a release default ("Alpamayo 2 Super default").
struct ConfigValue {
  std::string name, value, source;
};

struct ExpertConfig {
  Release release = Release::A2Super;

  // Transformer sizes (from the tensors; checked against the release's expert config keys).
  int L = 0;    // layers
  int D = 0;    // hidden size
  int Hq = 0;   // query heads
  int Hkv = 0;  // KV heads
  int d = 0;    // head dim
  int I = 0;    // MLP width
  double rms_eps = 1e-6;
  double rope_theta = 5e6;
  std::string eps_source = "default";    // where rms_eps came from
  std::string theta_source = "default";  // where rope_theta came from

  // action_in_proj (section 3).
  int ain_hidden = 1024;
  int ain_layers = 4;   // num_enc_layers
  int n_fourier = 20;   // num_fourier_feats (F)
  double max_freq = 100.0;
  // eps of the trunk's RMSNorms and of the final LayerNorm: the modules' defaults in every release (nn.RMSNorm /
  // nn.LayerNorm built without an eps argument), so no config key carries it.
  float ain_norm_eps = 1e-5f;

  // Action space (section 6).
  int T = 64;  // n_waypoints
  int A = 2;   // (acceleration, curvature)
  double dt = 0.1;
  double accel_mean = 0.0, accel_std = 1.0, curvature_mean = 0.0, curvature_std = 1.0;
  double accel_bounds[2] = {-9.8, 9.8};
  double curvature_bounds[2] = {-0.2, 0.2};
  double v_lambda = 1e-6, v_ridge = 1e-4;

  // Sampler (section 5).
  int num_steps = 10;
  std::string int_method = "euler";
  bool non_causal = true;
  // Classifier-free guidance as the release configures it (diffusion_cfg). Read and reported; a checkpoint
  // that asks for guidance is rejected at load until the sampler implements it.
  bool use_cfg = false;
  double guidance_weight = 1.0;
};

// The values the released checkpoints use; synthetic checkpoints copy them for realistic scale.
struct ReleasedActionStats {
  static constexpr double accel_mean = 0.02902694707164455;
  static constexpr double accel_std = 0.6810426736454882;
  static constexpr double curvature_mean = 0.0002692167976330542;
  static constexpr double curvature_std = 0.026148280660833106;
  static constexpr double accel_bound = 9.8;
  static constexpr double curvature_bound = 0.33;
};

}  // namespace alpamayo
