#include "io/config_json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <limits>
#include <type_traits>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "io/inputs.h"

namespace alpamayo {
using nlohmann::json;
using Section = ReleaseConfig::Section;

// Regular files only (a pipe fails at once), at most 64 MiB, strict JSON (io/inputs.h).
json read_json_file(const std::string& path) { return read_json_file_strict(path); }

namespace {

// Shortest decimal that reads back as the same double.
std::string fmt(double v) {
  char buf[40];
  for (int p = 6; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
std::string fmt(int v) { return std::to_string(v); }
std::string fmt(bool v) { return v ? "true" : "false"; }
std::string fmt(const std::string& v) { return v; }
std::string fmt(const double (&v)[2]) {
  std::string s("[");
  s += fmt(v[0]);
  s += ", ";
  s += fmt(v[1]);
  s += "]";
  return s;
}

std::string join(const std::string& label, const std::string& key) { return label.empty() ? key : label + "." + key; }
// "config.json expert_config.action_space_cfg.dt": a key as `inspect` shows its source.
std::string where(const Section& s, const std::string& key) { return s.file + " " + join(s.label, key); }
// "/path/config.json: 'expert_config.action_space_cfg.dt'": a key as an error message names it.
std::string key_in(const Section& s, const std::string& key) { return s.path + ": '" + join(s.label, key) + "'"; }

bool has(const Section& s, const char* key) { return s.obj && s.obj->contains(key) && !(*s.obj)[key].is_null(); }

bool get(const Section& s, const char* key, double* out) {
  if (!has(s, key)) return false;
  const json& v = (*s.obj)[key];
  check(v.is_number(), ErrorCode::Format, key_in(s, key) + " must be a number, found " + v.dump());
  *out = v.get<double>();
  check(std::isfinite(*out), ErrorCode::Format,
        key_in(s, key) + " must be a finite number, found " + v.dump() + " (beyond the range of a double)");
  return true;
}

bool get(const Section& s, const char* key, int* out) {
  if (!has(s, key)) return false;
  const json& v = (*s.obj)[key];
  const double x = v.is_number() ? v.get<double>() : 0.5;  // 12.0 is accepted as 12, as Python would
  const bool integral = v.is_number() && std::floor(x) == x && std::abs(x) < 2147483648.0;
  check(v.is_number() && std::floor(x) == x, ErrorCode::Format,
        key_in(s, key) + " must be an integer, found " + v.dump());
  check(integral, ErrorCode::Format,
        key_in(s, key) + " = " + v.dump() + " is out of range (an integer field holds at most 2^31 - 1)");
  *out = static_cast<int>(x);
  return true;
}

bool get(const Section& s, const char* key, bool* out) {
  if (!has(s, key)) return false;
  const json& v = (*s.obj)[key];
  check(v.is_boolean(), ErrorCode::Format, key_in(s, key) + " must be true or false, found " + v.dump());
  *out = v.get<bool>();
  return true;
}

bool get(const Section& s, const char* key, std::string* out) {
  if (!has(s, key)) return false;
  const json& v = (*s.obj)[key];
  check(v.is_string(), ErrorCode::Format, key_in(s, key) + " must be a string, found " + v.dump());
  *out = v.get<std::string>();
  return true;
}

bool get(const Section& s, const char* key, double (*out)[2]) {
  if (!has(s, key)) return false;
  const json& v = (*s.obj)[key];
  check(v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number(), ErrorCode::Format,
        key_in(s, key) + " must be [min, max], found " + v.dump());
  (*out)[0] = v[0].get<double>();
  (*out)[1] = v[1].get<double>();
  check(std::isfinite((*out)[0]) && std::isfinite((*out)[1]), ErrorCode::Format,
        key_in(s, key) + " must hold finite numbers, found " + v.dump());
  return true;
}

// Reads section.key into *out when present and records the value with its source (the key, or the default).
struct Recorder {
  std::vector<ConfigValue>* values;
  std::string dflt;
  template <class T>
  void read(const Section& s, const char* key, const std::string& name, T* out) const {
    const bool found = get(s, key, out);
    values->push_back({name, fmt(*out), found ? where(s, key) : dflt});
  }
};

// rope_theta: at the top level of a text config, or inside rope_parameters (transformers 5) / rope_scaling.
bool find_theta(const Section& s, double* theta, std::string* src) {
  if (get(s, "rope_theta", theta)) {
    *src = where(s, "rope_theta");
    return true;
  }
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    if (!has(s, k) || !(*s.obj)[k].is_object()) continue;
    const Section sub{&(*s.obj)[k], join(s.label, k), s.file, s.path};
    if (get(sub, "rope_theta", theta)) {
      *src = where(sub, "rope_theta");
      return true;
    }
  }
  return false;
}

// A hydra `_target_` names the class the release instantiates; only the one the engine implements is accepted.
void check_target(const Section& s, const char* cls) {
  std::string t;
  if (!get(s, "_target_", &t)) return;
  const std::string last = t.substr(t.rfind('.') == std::string::npos ? 0 : t.rfind('.') + 1);
  check(last == cls, ErrorCode::Unsupported,
        key_in(s, "_target_") + " is '" + t + "'; the engine implements " + cls + " only");
}

}  // namespace

Section ReleaseConfig::section(const Section& parent, const char* key, bool required) const {
  Section s{nullptr, join(parent.label, key), parent.file, parent.path};
  if (has(parent, key)) {
    check((*parent.obj)[key].is_object(), ErrorCode::Format,
          key_in(parent, key) + " must be an object, found " + (*parent.obj)[key].dump());
    s.obj = &(*parent.obj)[key];
  } else {
    check(!required, ErrorCode::Format,
          parent.path + ": missing '" + s.label + "', which an " + release_name(release_) +
              " config.json (model_type '" + release_model_type(release_) + "') must have");
  }
  return s;
}

ReleaseConfig::ReleaseConfig(const json& root, std::string path, const json* vlm, std::string vlm_path,
                             std::optional<Release> user)
    : root_(root), path_(std::move(path)), vlm_path_(std::move(vlm_path)) {
  check(root_.is_object(), ErrorCode::Format, path_ + ": expected a JSON object");
  release_ = recognise_release(root_, path_, user, &evidence_);
  const std::string name = release_name(release_);
  top_ = {&root_, "", std::filesystem::path(path_).filename().string(), path_};
  static const char* kFlat[] = {"expert_cfg", "action_in_proj_cfg", "action_space_cfg", "diffusion_cfg",
                                "expert_non_causal_attention"};
  if (release_ == Release::A2Super) {
    check(has(top_, "expert_config") || !has(top_, "action_space_cfg"), ErrorCode::Format,
          path_ + ": no 'expert_config' but a top-level 'action_space_cfg' (the Alpamayo-R1 / 1.5 layout); " + name +
              " (" + evidence_ + ") keeps its expert's sections in expert_config. Is model_type right?");
    base_ = section(top_, "expert_config", true);
    // A flat (R1-style) key at the top level of a Super config is not read by the release: an error when
    // expert_config lacks its counterpart (the file's values would otherwise silently become defaults).
    for (const char* k : kFlat) {
      if (!has(top_, k)) continue;
      bool nested = std::string(k) == "expert_cfg" ? has(base_, "llm_config") || has(base_, "expert_update_cfg")
                                                   : has(base_, k);
      if (std::string(k) == "expert_non_causal_attention" && !nested) {  // harmless when it equals the default
        bool top = true;
        get(top_, k, &top);
        nested = top;
      }
      const std::string counterpart = std::string(k) == "expert_cfg" ? "expert_config.llm_config / expert_update_cfg"
                                                                      : std::string("expert_config.") + k;
      check(nested, ErrorCode::Format,
            key_in(top_, k) + " is where Alpamayo-R1 and 1.5 keep it; " + name + " (" + evidence_ + ") reads " +
                counterpart + ", which is missing");
      notes_.push_back(std::string("top-level '") + k + "' ignored: " + name + " reads expert_config");
    }
    expert_ = section(base_, "llm_config", false);
    update_ = section(base_, "expert_update_cfg", false);
    check(expert_.obj || update_.obj, ErrorCode::Format,
          path_ +
              ": expert_config has neither 'llm_config' (the expert's text config) nor "
              "'expert_update_cfg'; " +
              name + " defines its expert with one of them");
    if (expert_.obj && update_.obj)
      for (const auto& [k, v] : update_.obj->items()) {
        if (!expert_.obj->contains(k) || !v.is_number() || !(*expert_.obj)[k].is_number()) continue;
        const double a = v.get<double>(), b = (*expert_.obj)[k].get<double>();
        check(a == b, ErrorCode::Format,
              key_in(update_, k) + " = " + fmt(a) + " contradicts '" + join(expert_.label, k) + "' = " + fmt(b));
      }
    const Section vlmc = section(top_, "vlm_config", false);
    const Section vt = section(vlmc, "text_config", false);
    if (vt.obj) vlm_text_.push_back(vt);
  } else {
    base_ = top_;
    // Super's nesting under a flat release's model_type: the flat keys this release reads must be there.
    for (const char* k : {"expert_config", "vlm_config"}) {
      if (!has(top_, k)) continue;
      for (const char* s : {"action_in_proj_cfg", "action_space_cfg", "diffusion_cfg"})
        check(has(top_, s), ErrorCode::Format,
              path_ + ": no top-level '" + s + "' but '" + k + "' (the Alpamayo 2 Super layout); " + name + " (" +
                  evidence_ + ") keeps its *_cfg keys at the top level. Is model_type right?");
      notes_.push_back(std::string("'") + k + "' ignored: " + name + " reads the top-level *_cfg keys");
    }
    check(!has(top_, "text_config"), ErrorCode::Format,
          key_in(top_, "text_config") + " is not part of an " + name +
              " config.json (the release builds its expert "
              "from the text config of the VLM named by vlm_name_or_path); pass that VLM's config.json with "
              "--vlm-config");
    expert_ = section(top_, "expert_cfg", false);
  }
  ain_ = section(base_, "action_in_proj_cfg", true);
  aspace_ = section(base_, "action_space_cfg", true);
  diffusion_ = section(base_, "diffusion_cfg", true);
  if (vlm) {
    const bool nested = vlm->is_object() && vlm->contains("text_config");
    vlm_text_storage_ = nested ? (*vlm)["text_config"] : *vlm;
    check(vlm_text_storage_.is_object(), ErrorCode::Format,
          vlm_path_ + ": expected a VLM config.json or its text_config (a JSON object)");
    vlm_text_.push_back({&vlm_text_storage_, nested ? "text_config" : "",
                         std::filesystem::path(vlm_path_).filename().string(), vlm_path_});
  }
}

std::vector<Section> ReleaseConfig::text_chain() const {
  if (release_ != Release::A2Super) {  // the expert is the VLM's text config with expert_cfg applied on top
    std::vector<Section> c{expert_};
    c.insert(c.end(), vlm_text_.begin(), vlm_text_.end());
    return c;
  }
  if (expert_.obj) return {update_, expert_};  // llm_config: the expert's own, complete text config
  std::vector<Section> c{update_};             // expert_update_cfg on top of the VLM's text config
  c.insert(c.end(), vlm_text_.begin(), vlm_text_.end());
  return c;
}

namespace {

// Every bound is documented in limits.h / docs/SECURITY.md; a value outside is a format error naming its key.
void in_range(double v, double lo, double hi, const Section& s, const char* key, const std::string& why = "") {
  check_range(v, lo, hi, key_in(s, key), why, ErrorCode::Format);
}

// action_in_proj_cfg: the Fourier features and the MLP trunk's sizes, within limits.h's bounds.
void read_action_in(const Section& ain, const Recorder& rec, ExpertConfig* cfg) {
  rec.read(ain, "hidden_size", "action_in_proj_cfg.hidden_size", &cfg->ain_hidden);
  rec.read(ain, "num_enc_layers", "action_in_proj_cfg.num_enc_layers", &cfg->ain_layers);
  rec.read(ain, "num_fourier_feats", "action_in_proj_cfg.num_fourier_feats", &cfg->n_fourier);
  rec.read(ain, "max_freq", "action_in_proj_cfg.max_freq", &cfg->max_freq);
  in_range(cfg->ain_hidden, 1, limits::kMaxHidden, ain, "hidden_size");
  in_range(cfg->ain_layers, 1, limits::kMaxEncLayers, ain, "num_enc_layers");
  in_range(cfg->n_fourier, 4, limits::kMaxFourier, ain, "num_fourier_feats");
  check(cfg->n_fourier % 2 == 0, ErrorCode::Format,
        key_in(ain, "num_fourier_feats") + " must be even, found " + fmt(cfg->n_fourier));
  check(cfg->max_freq > 0, ErrorCode::Format,
        key_in(ain, "max_freq") + " must be positive, found " + fmt(cfg->max_freq));
  in_range(cfg->max_freq, 0, limits::kMaxFreq, ain, "max_freq");
}

// action_space_cfg: the unicycle's waypoints, time step, action statistics and bounds, within limits.h's bounds.
void read_action_space(const Section& aspace, const Recorder& rec, ExpertConfig* cfg) {
  rec.read(aspace, "n_waypoints", "action_space_cfg.n_waypoints", &cfg->T);
  rec.read(aspace, "dt", "action_space_cfg.dt", &cfg->dt);
  rec.read(aspace, "accel_mean", "action_space_cfg.accel_mean", &cfg->accel_mean);
  rec.read(aspace, "accel_std", "action_space_cfg.accel_std", &cfg->accel_std);
  rec.read(aspace, "curvature_mean", "action_space_cfg.curvature_mean", &cfg->curvature_mean);
  rec.read(aspace, "curvature_std", "action_space_cfg.curvature_std", &cfg->curvature_std);
  rec.read(aspace, "accel_bounds", "action_space_cfg.accel_bounds", &cfg->accel_bounds);
  rec.read(aspace, "curvature_bounds", "action_space_cfg.curvature_bounds", &cfg->curvature_bounds);
  rec.read(aspace, "v_lambda", "action_space_cfg.v_lambda", &cfg->v_lambda);
  rec.read(aspace, "v_ridge", "action_space_cfg.v_ridge", &cfg->v_ridge);
  in_range(cfg->T, 1, limits::kMaxWaypoints, aspace, "n_waypoints");
  in_range(cfg->dt, limits::kMinDt, limits::kMaxDt, aspace, "dt", " seconds");
  in_range(cfg->accel_mean, -limits::kMaxActionStat, limits::kMaxActionStat, aspace, "accel_mean");
  in_range(cfg->curvature_mean, -limits::kMaxActionStat, limits::kMaxActionStat, aspace, "curvature_mean");
  for (const char* k : {"accel_std", "curvature_std"}) {
    const double v = std::string(k) == "accel_std" ? cfg->accel_std : cfg->curvature_std;
    check(v > 0, ErrorCode::Format, key_in(aspace, k) + " must be positive, found " + fmt(v));
    in_range(v, 0, limits::kMaxActionStat, aspace, k);
  }
  for (const char* k : {"accel_bounds", "curvature_bounds"}) {
    const double* b = std::string(k) == "accel_bounds" ? cfg->accel_bounds : cfg->curvature_bounds;
    check(b[0] <= b[1], ErrorCode::Format,
          key_in(aspace, k) + " = " +
              fmt(std::string(k) == "accel_bounds" ? cfg->accel_bounds : cfg->curvature_bounds) +
              ": the minimum exceeds the maximum");
    for (int i = 0; i < 2; ++i) in_range(b[i], -limits::kMaxBound, limits::kMaxBound, aspace, k);
  }
  in_range(cfg->v_lambda, 0, limits::kMaxFitWeight, aspace, "v_lambda");
  in_range(cfg->v_ridge, 0, limits::kMaxFitWeight, aspace, "v_ridge");
}

}  // namespace

void ReleaseConfig::apply(ExpertConfig* cfg, std::vector<ConfigValue>* values) const {
  cfg->release = release_;
  const std::string name = release_name(release_);
  const Recorder rec{values, name + " default"};

  const Section aout = section(base_, "action_out_proj_cfg", false);
  check_target(ain_, "PerWaypointActionInProjV2");
  check_target(aspace_, "UnicycleAccelCurvatureActionSpace");
  check_target(diffusion_, "FlowMatching");
  check_target(aout, "Linear");

  read_action_in(ain_, rec, cfg);
  read_action_space(aspace_, rec, cfg);

  rec.read(diffusion_, "num_inference_steps", "diffusion_cfg.num_inference_steps", &cfg->num_steps);
  rec.read(diffusion_, "int_method", "diffusion_cfg.int_method", &cfg->int_method);
  check(cfg->int_method == "euler", ErrorCode::Unsupported,
        key_in(diffusion_, "int_method") + " is '" + cfg->int_method +
            "'; the releases' FlowMatching (and the engine) integrate with euler only");
  in_range(cfg->num_steps, 1, limits::kMaxSteps, diffusion_, "num_inference_steps");
  if (release_ == Release::R1) {  // Alpamayo-R1's FlowMatching has no guidance switch: it never guides
    cfg->use_cfg = false;
    values->push_back({"diffusion_cfg.use_classifier_free_guidance", "false",
                       has(diffusion_, "use_classifier_free_guidance")
                           ? "fixed by " + name + " (no guidance in its sampler; " + where(diffusion_, "use_classifier_free_guidance") + " is not read)"
                           : "fixed by " + name + " (no guidance in its sampler)"});
  } else {
    rec.read(diffusion_, "use_classifier_free_guidance", "diffusion_cfg.use_classifier_free_guidance", &cfg->use_cfg);
  }
  rec.read(diffusion_, "inference_guidance_weight", "diffusion_cfg.inference_guidance_weight", &cfg->guidance_weight);
  in_range(cfg->guidance_weight, -limits::kMaxGuidanceWeight, limits::kMaxGuidanceWeight, diffusion_, "inference_guidance_weight");

  rec.read(base_, "expert_non_causal_attention", "expert_non_causal_attention", &cfg->non_causal);
  check(cfg->non_causal, ErrorCode::Unsupported,
        key_in(base_, "expert_non_causal_attention") +
            " = false: causal attention among the expert's own tokens is not supported (every released "
            "expert attends non-causally; the engine implements that only)");

  // eps / theta: the first text config of the release's chain that has them, else the Qwen3-VL defaults.
  const std::string qwen = release_ == Release::A2Super ? "Qwen3-VL text config default" :
                           "Qwen3-VL default (" + name + " inherits its VLM's)";
  cfg->eps_source = cfg->theta_source = qwen;
  cfg->rms_eps = 1e-6;
  cfg->rope_theta = 5e6;
  const std::vector<Section> chain = text_chain();
  for (const Section& s : chain)
    if (get(s, "rms_norm_eps", &cfg->rms_eps)) {
      cfg->eps_source = where(s, "rms_norm_eps");
      break;
    }
  for (const Section& s : chain)
    if (find_theta(s, &cfg->rope_theta, &cfg->theta_source)) break;
  check(cfg->rms_eps > 0 && cfg->rms_eps < 1, ErrorCode::Format,
        path_ + ": rms_norm_eps must be in (0, 1), found " + fmt(cfg->rms_eps) + " (" + cfg->eps_source + ")");
  check(cfg->rope_theta > 1 && cfg->rope_theta <= limits::kMaxRopeTheta, ErrorCode::Format,
        path_ + ": rope_theta must be in (1, 1e30], found " + fmt(cfg->rope_theta) + " (" + cfg->theta_source + ")");
  values->push_back({"rms_norm_eps", fmt(cfg->rms_eps), cfg->eps_source});
  values->push_back({"rope_theta", fmt(cfg->rope_theta), cfg->theta_source});
  std::string vlm_name;
  if (get(top_, "vlm_name_or_path", &vlm_name)) values->push_back({"vlm_name_or_path", vlm_name, where(top_, "vlm_name_or_path")});
  if (release_ != Release::A2Super && vlm_text_.empty())
    notes_.push_back("rms_norm_eps, rope_theta and the VLM's layer count come from the VLM's text config, which an " +
                     name + " config.json does not carry" +
                     (vlm_name.empty() ? std::string() : " (its VLM: " + vlm_name + ")") +
                     "; pass the VLM's config.json with --vlm-config to read and check them");
}

void ReleaseConfig::check_sizes(const ExpertConfig& c, std::vector<ConfigValue>* values) const {
  struct Size {
    const char* key;
    int actual;
    const char* what;
    std::string confirmed;
  };
  Size sizes[] = {{"num_hidden_layers", c.L, "the expert's layer count L", ""}, {"hidden_size", c.D, "D", ""},
                  {"intermediate_size", c.I, "I", ""},  {"num_attention_heads", c.Hq, "Hq", ""},
                  {"num_key_value_heads", c.Hkv, "Hkv", ""}, {"head_dim", c.d, "d", ""}};
  const bool super = release_ == Release::A2Super;
  auto check_in = [](const Section& s, Size& z, const std::string& why) {
    int v = 0;
    if (!get(s, z.key, &v)) return;
    check(v == z.actual, ErrorCode::Format,
          key_in(s, z.key) + " = " + fmt(v) + " but the checkpoint's tensors give " + z.what + " = " + fmt(z.actual) +
              why);
    z.confirmed += (z.confirmed.empty() ? "" : ", ") + where(s, z.key);
  };
  for (Size& z : sizes) {
    const std::string k = z.key;
    check_in(expert_, z, "");
    if (super) check_in(update_, z, "");
    // The VLM's text config: its layer count always (expert layer l reads the VLM's cache layer l). For
    // Super also its cache shape (KV heads, head dim); for R1 / 1.5 every size expert_cfg does not override,
    // since the expert is a copy of that config with expert_cfg applied.
    const bool layers = k == "num_hidden_layers";
    const bool cache = k == "num_key_value_heads" || k == "head_dim";
    for (const Section& s : vlm_text_) {
      if (layers) check_in(s, z, " (the expert reads the VLM's KV cache layer by layer)");
      else if (super ? cache : !has(expert_, z.key)) check_in(s, z, super ? " (the expert reads the VLM's KV cache)" : "");
    }
  }
  const char* names[] = {"layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim"};
  for (int i = 0; i < 6; ++i)
    values->push_back({names[i], fmt(sizes[i].actual),
                       "tensors" + (sizes[i].confirmed.empty() ? std::string(" (no config key states it)")
                                                               : "; matches " + sizes[i].confirmed)});
}

}  // namespace alpamayo
