// A Hugging Face checkpoint directory of an Alpamayo model: config.json plus single-file or sharded
// safetensors. Only the expert's tensors are mapped and read; vlm.* tensors (and shards holding only
// them) are never touched. The release is recognised from config.json (model_type / architectures), its
// values are read from where that release keeps them, and the tensor layout must be the release's.
#pragma once
#include <memory>
#include <optional>
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

const char* release_name(Release r);        // "Alpamayo-R1", "Alpamayo 1.5", "Alpamayo 2 Super"
const char* release_model_type(Release r);  // "alpamayo_r1", "alpamayo1_5", "alpamayo2_super"
Layout release_layout(Release r);           // the tensor layout the release uses
// Parses a user's release name: r1 | 1.5 | a2, or a model_type (alpamayo_r1, alpamayo1_5, alpamayo2_super).
Release parse_release(const std::string& name, const std::string& option);

struct CheckpointOptions {
  std::string vlm_config;          // optional VLM config.json (or its text_config): layer/KV checks, eps/theta
  std::optional<Release> release;  // the release whose layout config.json follows, when model_type is not one
                                   // of the known ones (a fork's renamed model_type)
};

class Checkpoint {
 public:
  // Opens dir/config.json and the weights, derives the sizes from the tensors and checks every tensor
  // and config key. vlm_config: optional VLM config.json (or its text_config) for eps/theta/layer checks.
  static std::shared_ptr<const Checkpoint> open(const std::string& dir, const std::string& vlm_config = "");
  static std::shared_ptr<const Checkpoint> open(const std::string& dir, const CheckpointOptions& options);

  const std::string& dir() const { return dir_; }
  const ExpertConfig& config() const { return cfg_; }
  Release release() const { return cfg_.release; }
  const std::string& release_evidence() const { return release_evidence_; }  // how the release was recognised
  const std::vector<ConfigValue>& values() const { return values_; }        // every value and its source
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
  std::string release_evidence_;
  std::vector<ConfigValue> values_;
  int64_t n_params_ = 0, n_vlm_skipped_ = 0;
  friend class CheckpointLoader;
};

}  // namespace alpamayo
