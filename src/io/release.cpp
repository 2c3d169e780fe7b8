// The known Alpamayo releases and how a config.json says which one it is.
#include <filesystem>

#include "alpamayo/error.h"
#include "io/config_json.h"

namespace alpamayo {
using nlohmann::json;

namespace {

// Class names and model types as the releases register them: AlpamayoR1Config / Alpamayo1_5Config /
// Alpamayo2SuperConfig (model_type) and the model classes config.json lists under architectures.
const ReleaseInfo kReleases[] = {
    {Release::R1, "Alpamayo-R1", "alpamayo_r1", "AlpamayoR1", "r1", Layout::R1, true},
    {Release::A1_5, "Alpamayo 1.5", "alpamayo1_5", "Alpamayo1_5", "1.5", Layout::R1, false},
    {Release::A2Super, "Alpamayo 2 Super", "alpamayo2_super", "Alpamayo2Super", "a2", Layout::A2, true},
};

std::string known_list() {
  std::string s;
  for (const auto& r : kReleases)
    s += std::string(s.empty() ? "" : ", ") + r.model_type + " (" + r.name + ", --release " + r.flag + ")";
  return s;
}

std::string base(const std::string& path) { return std::filesystem::path(path).filename().string(); }

}  // namespace

const ReleaseInfo& release_info(Release r) {
  for (const auto& i : kReleases)
    if (i.release == r) return i;
  throw Error(ErrorCode::Internal, "unknown release");
}

const char* release_name(Release r) { return release_info(r).name; }
const char* release_model_type(Release r) { return release_info(r).model_type; }
Layout release_layout(Release r) { return release_info(r).layout; }

Release parse_release(const std::string& name, const std::string& option) {
  for (const auto& r : kReleases)
    if (name == r.flag || name == r.model_type) return r.release;
  throw Error(option + ": unknown release '" + name + "' (known: " + known_list() + ")");
}

Release recognise_release(const json& root, const std::string& path, std::optional<Release> user,
                          std::string* evidence) {
  std::optional<Release> by_type, by_arch;
  std::string type, arch;
  if (root.contains("model_type") && !root["model_type"].is_null()) {
    check(root["model_type"].is_string(), ErrorCode::Format,
          path + ": 'model_type' must be a string, found " + root["model_type"].dump());
    type = root["model_type"].get<std::string>();
    for (const auto& r : kReleases)
      if (type == r.model_type) by_type = r.release;
  }
  if (root.contains("architectures") && !root["architectures"].is_null()) {
    const json& a = root["architectures"];
    check(a.is_array(), ErrorCode::Format, path + ": 'architectures' must be a list of class names, found " + a.dump());
    for (const json& e : a) {
      check(e.is_string(), ErrorCode::Format,
            path + ": 'architectures' must be a list of class names, found " + a.dump());
      for (const auto& r : kReleases)
        if (e.get<std::string>() == r.architecture && !by_arch) { by_arch = r.release; arch = r.architecture; }
    }
  }
  if (by_type && by_arch)
    check(*by_type == *by_arch, ErrorCode::Format,
          path + ": model_type '" + type + "' (" + release_name(*by_type) + ") contradicts architectures [" + arch +
              "] (" + release_name(*by_arch) + ")");
  const std::optional<Release> said = by_type ? by_type : by_arch;
  std::string what;
  if (by_type) what = "model_type '" + type + "'";
  if (by_arch) what += std::string(what.empty() ? "" : ", ") + "architectures [" + arch + "]";
  if (user) {
    check(!said || *said == *user, path + ": " + what + " says " + release_name(*said) + " but --release says " +
                                       release_name(*user) + "; drop --release or fix config.json");
    *evidence = said ? what + " (and --release " + release_info(*user).flag + ")"
                     : std::string("--release ") + release_info(*user).flag + " (" + base(path) +
                           (type.empty() ? " has no model_type" : " model_type '" + type + "' is not a known release") + ")";
    return *user;
  }
  if (said) {
    *evidence = what;
    return *said;
  }
  throw Error(ErrorCode::Format,
              path + ": " +
                  (type.empty() ? std::string("no 'model_type' (or 'architectures') naming a known Alpamayo release")
                                : "model_type '" + type + "' is not a known Alpamayo release") +
                  "; known: " + known_list() +
                  ". If this config.json follows one of those layouts, say which with --release");
}

}  // namespace alpamayo
