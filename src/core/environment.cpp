#include "alpamayo/environment.h"

#include <cstdlib>

namespace alpamayo {
namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

void options_from_environment(BackendOptions& o) {
  if (o.kernels.empty()) {
    if (std::string v = variable("ALPAMAYO_CPU_KERNELS"); !v.empty()) {
      o.kernels = v;
      o.kernels_source = "ALPAMAYO_CPU_KERNELS";
    }
  }
  if (o.isa_cap.empty()) {
    if (std::string v = variable("ALPAMAYO_CPU_ISA"); !v.empty()) {
      o.isa_cap = v;
      o.isa_cap_source = "ALPAMAYO_CPU_ISA";
    }
  }
}

std::string memory_limit_from_environment() { return variable("ALPAMAYO_MEMORY_LIMIT"); }

}  // namespace alpamayo
