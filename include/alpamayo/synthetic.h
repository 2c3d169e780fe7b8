// Synthetic, seeded checkpoints and contexts in the exact release layouts, for tests, demos and benchmarks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "alpamayo/checkpoint.h"
#include "alpamayo/output.h"
#include "alpamayo/tensor.h"

namespace alpamayo {

struct SyntheticCheckpointSpec {
  Layout layout = Layout::A2;
  int L = 64, D = 1536, Hq = 16, Hkv = 8, d = 128, I = 6144;  // the seed's model (Alpamayo 2 Super)
  int ain_hidden = 512, ain_layers = 2, n_fourier = 20;
  double max_freq = 100.0;
  int T = 64, steps = 10;
  DType dtype = DType::BF16;
  int shards = 1;
  uint64_t seed = 0;
  bool text_config = false;  // also write a text_config (the releases' config.json has none)
};

// Writes dir/config.json and the weights (single file, or `shards` expert shards plus a vlm-only shard
// and model.safetensors.index.json), all committed together (output.h). A few vlm.* tensors are
// included, as in a real checkpoint.
void write_synthetic_checkpoint(const std::string& dir, const SyntheticCheckpointSpec& spec);

struct SyntheticContextSpec {
  int B = 1, P = 4700;
  std::vector<int64_t> valid_len;   // default: P for every sample
  std::vector<int64_t> rope_delta;  // default: 0
  DType dtype = DType::BF16;
  int history = 16;                 // ego history poses (0: write v0 instead)
  uint64_t seed = 0;
};

// Writes a context file for a checkpoint of the given config (L, Hkv, d); padding rows hold garbage.
void write_synthetic_context(const std::string& path, const ExpertConfig& cfg, const SyntheticContextSpec& spec);
// The same bytes to a sink (e.g. an OutputSet output).
void write_synthetic_context(const ByteSink& out, const ExpertConfig& cfg, const SyntheticContextSpec& spec);

}  // namespace alpamayo
