// Reading an Alpamayo config.json as its release ships it (docs/FORMATS.md, "config.json by release"):
// the release is recognised from model_type / architectures, then every value is read from where that
// release keeps it, with that release's default where the file omits it, and each value's source recorded.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/checkpoint.h"
#include "alpamayo/config.h"

namespace alpamayo {

nlohmann::json read_json_file(const std::string& path);

// How a release recognises itself and what its checkpoint holds.
struct ReleaseInfo {
  Release release;
  const char* name;          // "Alpamayo 2 Super"
  const char* model_type;    // config.json model_type
  const char* architecture;  // config.json architectures[0]
  const char* flag;          // the --release spelling: r1 | 1.5 | a2
  Layout layout;             // tensor layout
  bool reads_buffers;        // loads action_space.* / Fourier freqs buffers when the checkpoint has them
};
const ReleaseInfo& release_info(Release r);

// The release config.json declares: model_type, else architectures; `user` (--release) decides only when
// neither names a known release, and must agree when one does. Throws naming the key, what was found
// and the known releases. *evidence: how it was recognised, for `inspect`.
Release recognise_release(const nlohmann::json& root, const std::string& path, std::optional<Release> user,
                          std::string* evidence);

// One checkpoint's config.json read for its release.
class ReleaseConfig {
 public:
  // root: config.json at `path`; vlm: the --vlm-config file (a VLM config.json or its text_config) or null.
  // Recognises the release and checks that config.json has that release's shape (required sections
  // present, no section where another release keeps it).
  ReleaseConfig(const nlohmann::json& root, std::string path, const nlohmann::json* vlm, std::string vlm_path,
                std::optional<Release> user);
  ReleaseConfig(const ReleaseConfig&) = delete;  // sections point into root and into this object
  ReleaseConfig& operator=(const ReleaseConfig&) = delete;

  Release release() const { return release_; }
  const std::string& evidence() const { return evidence_; }
  const std::vector<std::string>& notes() const { return notes_; }

  // Every value except the tensor-derived sizes, into cfg; appends each value and its source.
  void apply(ExpertConfig* cfg, std::vector<ConfigValue>* values) const;
  // The tensor-derived sizes (L, D, Hq, Hkv, d, I) against every key of the release that states them;
  // appends the sizes with the keys that confirmed them.
  void check_sizes(const ExpertConfig& cfg, std::vector<ConfigValue>* values) const;

  // A JSON object of the config and its label: "expert_config.action_space_cfg" in config.json.
  struct Section {
    const nlohmann::json* obj = nullptr;  // null: absent
    std::string label;                    // key path inside `file`
    std::string file;                     // file name shown in sources ("config.json")
    std::string path;                     // full path, for error messages
  };

 private:
  Section section(const Section& parent, const char* key, bool required) const;
  std::vector<Section> text_chain() const;  // where eps / theta are looked up, highest precedence first

  const nlohmann::json& root_;
  std::string path_, vlm_path_;
  Release release_;
  std::string evidence_;
  mutable std::vector<std::string> notes_;  // apply() adds hints about defaults
  Section top_, base_;                       // config.json; where the expert's sections live
  Section ain_, aspace_, diffusion_;         // action_in_proj_cfg, action_space_cfg, diffusion_cfg
  Section expert_, update_;                  // R1/1.5: expert_cfg; Super: llm_config, expert_update_cfg
  std::vector<Section> vlm_text_;            // VLM text configs: Super's vlm_config.text_config, --vlm-config
  nlohmann::json vlm_text_storage_;
};

}  // namespace alpamayo
