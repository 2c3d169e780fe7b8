// The backends compiled into this build. Adding a backend (docs/ARCHITECTURE.md): its folder under src/backends
// with its CMake target, and its entry here; the conformance suite (tests/cpp/test_conformance.cpp) then runs it
// against the reference backend for every weight format it lists.
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

void register_backend(BackendInfo info) {
  check(!backends_frozen(), "register_backend(" + info.name +
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
        {"cpu", {"bf16", "int8", "bfp8_b", "bfp4_b"}, {"bf16", "int8"}, load_cpu_backend, [] { return std::string(); },
         true},
#endif
        {"reference", {"f32", "bfp8_b", "bfp4_b"}, {"f32", "int8"}, load_reference_backend},
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
  throw Error("unknown backend '" + name + "' (available in this build: " + known + ")");
}

}  // namespace alpamayo
