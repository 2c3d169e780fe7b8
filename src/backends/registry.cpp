// The backends compiled into this build. Adding a backend (docs/ARCHITECTURE.md): its folder under src/backends
// with its CMake target and a function returning its BackendInfo (formats, features, memory), and that function
// listed here; the conformance suite (tests/cpp/test_conformance.cpp) then runs it against the reference backend
// for every weight format and every case its features allow.
#include <algorithm>

#include "alpamayo/backend.h"
#include "alpamayo/error.h"
#include "backends/reference/reference_backend.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/cpu_backend.h"
#endif
#ifdef ALPAMAYO_WITH_CUDA_BACKEND
#include "backends/cuda/cuda_backend.h"
#endif

namespace alpamayo {

namespace {

// Backends a program adds before it first looks one up (register_backend); the built-in list is fixed at build.
std::vector<BackendInfo>& added_backends() {
  static std::vector<BackendInfo> added;
  return added;
}
bool& backends_frozen() {
  static bool frozen = false;
  return frozen;
}

}  // namespace

std::vector<std::string> context_features(const KVCache& kv) {
  std::vector<std::string> f;
  bool shared = kv.G != kv.B;
  for (int b = 0; b < kv.B && !shared; ++b) shared = kv.prompt(b) != b;
  if (shared) f.push_back("shared prompts");
  if (!kv.suffix_key.empty()) f.push_back("suffix rows");
  for (int g = 0; g < kv.G; ++g)
    if (kv.pad(g) > 0) {
      f.push_back("left padding");
      break;
    }
  bool strided = false;  // a backend that reads page pools reads them with any strides
  for (const auto* list : {&kv.key, &kv.value, &kv.suffix_key, &kv.suffix_value})
    for (const TensorView& t : *list) strided = strided || (!kv.paged() && !t.is_contiguous());
  if (strided) f.push_back("strided cache views");
  if (kv.paged()) f.push_back("paged caches");
  return f;
}

std::string missing_feature(const BackendFeatures& f, const ExpertConfig& c, const KVCache& kv, bool guided) {
  for (const std::string& need : context_features(kv))
    if (!(need == "shared prompts"        ? f.shared_prompts
          : need == "suffix rows"         ? f.suffix_rows
          : need == "left padding"        ? f.left_padding
          : need == "strided cache views" ? f.strided_cache
                                          : f.paged_cache))
      return need;
  if (guided && !f.guidance) return "classifier-free guidance";
  if (f.max_batch) {
    const int64_t most = f.max_batch(c);
    if (kv.B > most)
      return "a batch of " + std::to_string(kv.B) + " samples (at most " + std::to_string(most) + " for this model)";
  }
  return "";
}

void register_backend(BackendInfo info) {
  check(!backends_frozen(), ErrorCode::InvalidState, "register_backend(" + info.name +
                                "): backends were already listed; register before the first Model::load or listing");
  for (const BackendInfo& b : added_backends())
    check(b.name != info.name, "register_backend: a backend named " + info.name + " is already registered");
  added_backends().push_back(std::move(info));
}

// Preference: cuda, then cpu, then reference, then any a program registered; a backend that cannot run on this
// machine (the cuda backend where there is no GPU) moves behind the ones that can, so the default backend runs.
const std::vector<BackendInfo>& registered_backends() {
  static const std::vector<BackendInfo> all = [] {
    backends_frozen() = true;
    std::vector<BackendInfo> v = {
#ifdef ALPAMAYO_WITH_CUDA_BACKEND
        cuda::backend_info(),
#endif
#ifdef ALPAMAYO_WITH_CPU_BACKEND
        cpu_backend_info(),
#endif
        reference_backend_info(),
    };
    for (const BackendInfo& b : added_backends()) {
      for (const BackendInfo& built_in : v)
        check(b.name != built_in.name, "register_backend: " + b.name + " is the name of a built-in backend");
      v.push_back(b);
    }
    std::stable_partition(v.begin(), v.end(), [](const BackendInfo& b) { return b.unavailable().empty(); });
    return v;
  }();
  return all;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> n;
  for (const BackendInfo& b : registered_backends()) n.push_back(b.name);
  return n;
}

const BackendInfo& find_backend(const std::string& name) {
  std::string known;
  for (const BackendInfo& b : registered_backends()) {
    if (b.name == name) return b;
    known += (known.empty() ? "" : ", ") + b.name;
  }
  throw Error(ErrorCode::Unsupported, "unknown backend '" + name + "' (available in this build: " + known + ")");
}

}  // namespace alpamayo
