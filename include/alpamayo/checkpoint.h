// A Hugging Face checkpoint directory of an Alpamayo model: config.json plus single-file or sharded
// safetensors. Only the expert's tensors are mapped and read; vlm.* tensors (and shards holding only
// them) are never touched. Both release layouts are detected from the keys present.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/config.h"
#include "alpamayo/safetensors.h"
#include "alpamayo/weights.h"

namespace alpamayo {

enum class Layout {
  R1,  // Alpamayo-R1 / 1.5: expert.layers.*, action_in_proj.*, derived buffers present
  A2,  // Alpamayo 2: expert.expert.layers.*, expert.action_in_proj.*, no derived buffers
};
const char* layout_name(Layout l);

class Checkpoint {
 public:
  // Opens dir/config.json and the weights, derives the sizes from the tensors and checks every tensor
  // and config key. vlm_config: optional VLM config.json (or its text_config) for eps/theta/layer checks.
  static std::shared_ptr<const Checkpoint> open(const std::string& dir, const std::string& vlm_config = "");

  const std::string& dir() const { return dir_; }
  const ExpertConfig& config() const { return cfg_; }
  Layout layout() const { return layout_; }
  const ExpertWeights& expert() const { return expert_; }
  const ActionInProjWeights& action_in() const { return ain_; }
  const ActionOutProjWeights& action_out() const { return aout_; }
  // Views of every weight a sample needs (valid while this Checkpoint lives).
  ModelWeights weights() const { return {expert_, ain_, aout_}; }
  const std::vector<std::string>& files() const { return files_; }     // shards actually mapped
  const std::vector<std::string>& notes() const { return notes_; }     // where values came from
  int64_t expert_parameters() const { return n_params_; }
  int64_t vlm_tensors_skipped() const { return n_vlm_skipped_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  ExpertConfig cfg_;
  Layout layout_ = Layout::R1;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  ExpertWeights expert_;
  ActionInProjWeights ain_;
  ActionOutProjWeights aout_;
  std::vector<std::string> files_, notes_;
  int64_t n_params_ = 0, n_vlm_skipped_ = 0;
  friend class CheckpointLoader;
};

}  // namespace alpamayo
