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
  if (const char* k = env("ALPAMAYO_CPU_KERNELS"); k && name == "cpu" && o.kernels.empty()) {
    o.kernels = k;
    o.kernels_source = "ALPAMAYO_CPU_KERNELS";
  }
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
