// options_from_environment (alpamayo/environment.h): the one place that turns environment variables into
// BackendOptions. A plain list, one variable after another.
#include "alpamayo/environment.h"

#include <cstdlib>

#include "alpamayo/error.h"

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
  if (const char* g = env("ALPAMAYO_CUDA_GEMM")) {
    const std::string v = g;
    check(v == "cublaslt" || v == "own", "ALPAMAYO_CUDA_GEMM: expected cublaslt or own, found '" + v + "'");
    if (name == "cuda" && o.kernels.empty()) o.kernels = "gemm=" + v;
  }
  if (const char* g = env("ALPAMAYO_CUDA_GRAPHS")) o.graphs = o.graphs && std::string(g) != "0";
  if (const char* p = env("ALPAMAYO_CUBLASLT"); p && o.cublaslt_path.empty()) o.cublaslt_path = p;
}

}  // namespace alpamayo
