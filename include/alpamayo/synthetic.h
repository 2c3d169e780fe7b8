// Synthetic, seeded checkpoints and contexts in the exact release layouts, for tests, demos and benchmarks.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/checkpoint.h"
#include "alpamayo/output.h"
#include "alpamayo/tensor.h"

namespace alpamayo {

struct SyntheticCheckpointSpec {
  Layout layout = Layout::A2;
  // The release whose config.json and tensors are written; default: Alpamayo-R1 for Layout::R1, Alpamayo 2
  // Super for Layout::A2. Must use `layout` (Alpamayo 1.5: Layout::R1).
  std::optional<Release> release;
  int L = 64, D = 1536, Hq = 16, Hkv = 8, d = 128, I = 6144;  // the seed's model (Alpamayo 2 Super)
  int ain_hidden = 512, ain_layers = 2, n_fourier = 20;
  double max_freq = 100.0;
  int T = 64, steps = 10;
  // Alpamayo 2 Super's config.json carries the expert's text config (expert_config.llm_config): its eps and
  // theta. Alpamayo-R1 / 1.5 take them from the VLM's config (--vlm-config), so they are not written there.
  double rms_eps = 1e-6, rope_theta = 5e6;
  DType dtype = DType::BF16;
  int shards = 1;
  uint64_t seed = 0;
  // The expert's weight matrices with a trained model's statistics (heavy tails, per-channel scales, outlier
  // channels and weights; src/io/synthetic.cpp) instead of uniform values of the same standard deviation.
  bool trained_weights = false;
};

Release synthetic_release(const SyntheticCheckpointSpec& spec);

// Writes dir/config.json shaped as the release ships it (Alpamayo-R1 / 1.5: flat *_cfg keys; Alpamayo 2
// Super: vlm_config + expert_config) and the weights in the release's layout (single file, or `shards`
// expert shards plus a vlm-only shard and model.safetensors.index.json). Derived buffers are written for
// Alpamayo-R1 only, as the releases do. All files are committed together (output.h). A few vlm.*
// tensors are included, as in a real checkpoint.
void write_synthetic_checkpoint(const std::string& dir, const SyntheticCheckpointSpec& spec);

struct SyntheticContextSpec {
  int B = 1, P = 4700;              // samples, prompt rows
  int G = 0;                        // prompts (0: one per sample, G = B)
  std::vector<int64_t> valid_len;   // per prompt; default: P
  std::vector<int64_t> prompt_index;  // per sample; default: b (needs G = B), or all 0 when G = 1
  std::vector<int64_t> prefix_pad;  // per prompt: leading masked rows; default: none
  int Q = 0;                        // suffix rows per sample (0: no suffix caches)
  std::vector<int64_t> suffix_len;  // per sample; default: Q
  std::vector<int64_t> rope_delta;  // per sample; default: 0
  DType dtype = DType::BF16;
  int history = 16;                 // ego history poses (0: write v0 instead)
  uint64_t seed = 0;
};

// Writes a context file for a checkpoint of the given config (L, Hkv, d); padding rows hold garbage.
void write_synthetic_context(const std::string& path, const ExpertConfig& cfg, const SyntheticContextSpec& spec);
// The same bytes to a sink (e.g. an OutputSet output). Before anything is generated the memory it needs is
// checked (check_memory, naming the sizes), then check_disk, when given, gets the file's size and the stage
// for the message (e.g. OutputSet::check_space).
void write_synthetic_context(const ByteSink& out, const ExpertConfig& cfg, const SyntheticContextSpec& spec,
                             const std::function<void(double bytes, const std::string& stage)>& check_disk = {});

}  // namespace alpamayo
