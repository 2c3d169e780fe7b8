#include "io/config_json.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "alpamayo/error.h"
#include "io/inputs.h"

namespace alpamayo {
using nlohmann::json;

// Regular files only (a pipe fails at once), at most 64 MiB, strict JSON (io/inputs.h).
json read_json_file(const std::string& path) { return read_json_file_strict(path); }

namespace {

// Reads obj[key] as a number into *out when present; throws naming the key if it is not a number.
template <class T>
bool get_num(const json& obj, const char* key, const std::string& where, T* out) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return false;
  const json& v = obj[key];
  check(v.is_number(), where + ": key '" + key + "' must be a number, found " + v.dump());
  if constexpr (std::is_integral_v<T>) {  // an integer in T's range: no truncation, no wrapping
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                          : v.is_number_integer() && v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max());
    check(v.is_number_integer(), where + ": key '" + key + "' must be an integer, found " + v.dump());
    check(in_range, where + ": key '" + key + "' = " + v.dump() + " is out of range");
  } else {
    check(std::isfinite(v.get<double>()), where + ": key '" + key + "' must be a finite number, found " + v.dump());
  }
  *out = v.get<T>();
  return true;
}

const json& section(const json& root, const char* key, const std::string& path) {
  static const json empty = json::object();
  if (!root.contains(key) || root[key].is_null()) return empty;
  check(root[key].is_object(), path + ": '" + key + "' must be an object");
  return root[key];
}

void get_bounds(const json& obj, const char* key, const std::string& where, double out[2]) {
  if (!obj.contains(key) || obj[key].is_null()) return;
  const json& v = obj[key];
  check(v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number(),
        where + ": '" + key + "' must be [min, max], found " + v.dump());
  out[0] = v[0].get<double>();
  out[1] = v[1].get<double>();
}

// rope_theta may sit at the top level or inside rope_scaling / rope_parameters (newer configs).
bool find_theta(const json& t, double* theta) {
  if (!t.is_object()) return false;
  if (t.contains("rope_theta") && t["rope_theta"].is_number()) { *theta = t["rope_theta"].get<double>(); return true; }
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (t.contains(k) && t[k].is_object() && t[k].contains("rope_theta") && t[k]["rope_theta"].is_number()) {
      *theta = t[k]["rope_theta"].get<double>();
      return true;
    }
  return false;
}

void check_size(const json& obj, const char* key, const std::string& where, int actual, const std::string& what) {
  int64_t v = 0;
  if (get_num(obj, key, where, &v))
    check(v == actual, where + ": '" + key + "' = " + std::to_string(v) + " but the checkpoint's tensors give " +
                           what + " = " + std::to_string(actual));
}

}  // namespace

void apply_config_json(const json& root, const std::string& path, const json* text, const std::string& text_path,
                       ExpertConfig* cfg, std::vector<std::string>* notes) {
  check(root.is_object(), path + ": expected a JSON object");
  const json& ain = section(root, "action_in_proj_cfg", path);
  const std::string ain_w = path + ": action_in_proj_cfg";
  get_num(ain, "hidden_size", ain_w, &cfg->ain_hidden);
  get_num(ain, "num_enc_layers", ain_w, &cfg->ain_layers);
  get_num(ain, "num_fourier_feats", ain_w, &cfg->n_fourier);
  get_num(ain, "max_freq", ain_w, &cfg->max_freq);
  check(cfg->ain_layers >= 1, ain_w + ": num_enc_layers must be >= 1, found " + std::to_string(cfg->ain_layers));
  check(cfg->n_fourier >= 4 && cfg->n_fourier % 2 == 0,
        ain_w + ": num_fourier_feats must be even and >= 4, found " + std::to_string(cfg->n_fourier));
  check(cfg->max_freq > 0, ain_w + ": max_freq must be positive");

  const json& as = section(root, "action_space_cfg", path);
  const std::string as_w = path + ": action_space_cfg";
  get_num(as, "n_waypoints", as_w, &cfg->T);
  get_num(as, "dt", as_w, &cfg->dt);
  get_num(as, "accel_mean", as_w, &cfg->accel_mean);
  get_num(as, "accel_std", as_w, &cfg->accel_std);
  get_num(as, "curvature_mean", as_w, &cfg->curvature_mean);
  get_num(as, "curvature_std", as_w, &cfg->curvature_std);
  get_num(as, "v_lambda", as_w, &cfg->v_lambda);
  get_num(as, "v_ridge", as_w, &cfg->v_ridge);
  get_bounds(as, "accel_bounds", as_w, cfg->accel_bounds);
  get_bounds(as, "curvature_bounds", as_w, cfg->curvature_bounds);
  check(cfg->T >= 1, as_w + ": n_waypoints must be >= 1");
  check(cfg->dt > 0, as_w + ": dt must be positive");

  const json& df = section(root, "diffusion_cfg", path);
  get_num(df, "num_inference_steps", path + ": diffusion_cfg", &cfg->num_steps);
  if (df.contains("int_method") && df["int_method"].is_string()) cfg->int_method = df["int_method"].get<std::string>();
  check(cfg->int_method == "euler", path + ": diffusion_cfg.int_method '" + cfg->int_method + "' is not supported (euler)");
  check(cfg->num_steps >= 1, path + ": diffusion_cfg.num_inference_steps must be >= 1");
  if (root.contains("expert_non_causal_attention") && root["expert_non_causal_attention"].is_boolean())
    cfg->non_causal = root["expert_non_causal_attention"].get<bool>();
  check(cfg->non_causal, path + ": expert_non_causal_attention = false is not supported (the released experts are non-causal)");

  // eps / theta: Qwen3-VL defaults < VLM text config < expert_cfg (applied on top, as the release does).
  const json& ecfg = section(root, "expert_cfg", path);
  cfg->eps_source = cfg->theta_source = "Qwen3-VL default";
  if (text && get_num(*text, "rms_norm_eps", text_path, &cfg->rms_eps)) cfg->eps_source = text_path;
  if (text && find_theta(*text, &cfg->rope_theta)) cfg->theta_source = text_path;
  if (get_num(ecfg, "rms_norm_eps", path + ": expert_cfg", &cfg->rms_eps)) cfg->eps_source = path + " expert_cfg";
  if (find_theta(ecfg, &cfg->rope_theta)) cfg->theta_source = path + " expert_cfg";
  check(cfg->rms_eps > 0, path + ": rms_norm_eps must be positive");
  check(cfg->rope_theta > 1, path + ": rope_theta must be > 1");
  notes->push_back("rms_norm_eps " + std::to_string(cfg->rms_eps) + " from " + cfg->eps_source);
  notes->push_back("rope_theta " + std::to_string(cfg->rope_theta) + " from " + cfg->theta_source);
}

void check_sizes_against_config(const json& root, const std::string& path, const json* text,
                                const std::string& text_path, const ExpertConfig& c) {
  const json& e = section(root, "expert_cfg", path);
  const std::string ew = path + ": expert_cfg";
  check_size(e, "hidden_size", ew, c.D, "D");
  check_size(e, "intermediate_size", ew, c.I, "I");
  check_size(e, "num_attention_heads", ew, c.Hq, "Hq");
  check_size(e, "num_key_value_heads", ew, c.Hkv, "Hkv");
  check_size(e, "head_dim", ew, c.d, "d");
  check_size(e, "num_hidden_layers", ew, c.L, "L");
  if (text) {
    check_size(*text, "num_hidden_layers", text_path, c.L, "the expert's layer count L");
    if (!e.contains("num_key_value_heads")) check_size(*text, "num_key_value_heads", text_path, c.Hkv, "Hkv");
    if (!e.contains("head_dim")) check_size(*text, "head_dim", text_path, c.d, "d");
  }
}

}  // namespace alpamayo
