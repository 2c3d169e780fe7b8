// The backends compiled into this build. Adding a backend: implement BackendModel/BackendSession (or a
// HostLoopSession), add its entry here; the conformance suite (tests/cpp/test_conformance.cpp) then
// runs it against the reference backend for every weight format it lists.
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

// Preference: cuda, then cpu, then reference; a backend that cannot run on this machine (the cuda backend
// where there is no GPU) moves behind the ones that can, so the default backend always runs.
const std::vector<BackendInfo>& registered_backends() {
  static const std::vector<BackendInfo> all = [] {
    std::vector<BackendInfo> v = {
#ifdef ALPAMAYO_WITH_CUDA_BACKEND
        {"cuda", {"bf16", "fp8"}, {"bf16"}, load_cuda_backend, cuda_unavailable},
#endif
#ifdef ALPAMAYO_WITH_CPU_BACKEND
        {"cpu", {"bf16", "int8", "bfp8_b", "bfp4_b"}, {"bf16", "int8"}, load_cpu_backend, [] { return std::string(); },
         true},
#endif
        {"reference", {"f32", "bfp8_b", "bfp4_b"}, {"f32", "int8"}, load_reference_backend},
    };
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
