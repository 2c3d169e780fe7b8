// Parsing of the Alpamayo config.json (flat AlpamayoR1Config) and an optional VLM text config.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "alpamayo/config.h"

namespace alpamayo {

nlohmann::json read_json_file(const std::string& path);

// Fills the non-size fields of cfg (action_in_proj, action space, sampler, eps/theta) from config.json
// and the optional text config; `notes` records where eps and theta came from.
void apply_config_json(const nlohmann::json& cfg_json, const std::string& cfg_path, const nlohmann::json* text_cfg,
                       const std::string& text_path, ExpertConfig* cfg, std::vector<std::string>* notes);

// Checks the tensor-derived sizes (L, D, Hq, Hkv, d, I) against expert_cfg and the text config.
void check_sizes_against_config(const nlohmann::json& cfg_json, const std::string& cfg_path,
                                const nlohmann::json* text_cfg, const std::string& text_path, const ExpertConfig& cfg);

}  // namespace alpamayo
