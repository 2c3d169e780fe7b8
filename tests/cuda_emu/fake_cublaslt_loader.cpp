// The cuda_emu backend's stand-in for src/backends/cuda/cublaslt_loader.cpp: its cuBLASLt is fake_cuda.h's,
// always there. load() records the library it was asked for, so a test can see BackendOptions::cublaslt_path
// reach it (fake_cublaslt.h).
#include "fake_cublaslt.h"

#include <mutex>

#include "backends/cuda/cublaslt_loader.h"

namespace alpamayo::cuda_emu {
namespace {

std::mutex& requests_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& requests() {
  static std::vector<std::string> r;
  return r;
}

}  // namespace

namespace lt {

std::string library_name(const std::string& path) { return path.empty() ? "fake cuBLASLt" : path; }

std::string load(const std::string& path) {
  std::lock_guard<std::mutex> g(requests_mutex());
  requests().push_back(path);
  return "";
}

}  // namespace lt

std::vector<std::string> fake_cublaslt_requests() {
  std::lock_guard<std::mutex> g(requests_mutex());
  return requests();
}

}  // namespace alpamayo::cuda_emu
