// options_from_environment (alpamayo/environment.h): the one place that turns environment variables into
// BackendOptions. A plain list, one variable after another.
#include "alpamayo/environment.h"

#include <cstdlib>


namespace alpamayo {

namespace {

// The variable's value, or null when it is unset or empty.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

void options_from_environment(BackendOptions& o, const std::string& backend) {
  const std::string name = backend.empty() ? backend_names().front() : backend;
  // The backend's own kernels variable, as its registry entry names it (an unknown backend is Model::load's error).
  for (const BackendInfo& b : registered_backends())
    if (b.name == name && !b.kernels_variable.empty())
      if (const char* k = env(b.kernels_variable.c_str()); k && o.kernels.empty()) {
        o.kernels = b.kernels_variable_op.empty() ? std::string(k) : b.kernels_variable_op + "=" + k;
        o.kernels_source = b.kernels_variable;
      }
  if (const char* g = env("ALPAMAYO_CUDA_GRAPHS")) o.graphs = o.graphs && std::string(g) != "0";
  if (const char* p = env("ALPAMAYO_CUBLASLT"); p && o.cublaslt_path.empty()) o.cublaslt_path = p;
  if (const char* c = env("ALPAMAYO_CPU_ISA"); c && o.isa_cap.empty()) {
    o.isa_cap = c;
    o.isa_cap_source = "ALPAMAYO_CPU_ISA";
  }
}

std::string memory_limit_from_environment() {
  const char* v = env("ALPAMAYO_MEMORY_LIMIT");
  return v ? v : "";
}

}  // namespace alpamayo
