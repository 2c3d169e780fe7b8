// options_from_environment (alpamayo/environment.h): the variables the programs' boundary turns into
// BackendOptions, where the caller left an option at its default.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "alpamayo/environment.h"
#include "test_util.h"

namespace alpamayo {
namespace {

// Sets (or unsets) a variable for the scope, restoring what was there.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvVar() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Environment, NothingSetLeavesTheOptions) {
  const EnvVar g("ALPAMAYO_CUDA_GEMM", nullptr), r("ALPAMAYO_CUDA_GRAPHS", nullptr), l("ALPAMAYO_CUBLASLT", nullptr);
  BackendOptions o;
  options_from_environment(o, "cuda");
  EXPECT_EQ(o.kernels, "");
  EXPECT_TRUE(o.graphs);
  EXPECT_EQ(o.cublaslt_path, "");
}

// Each backend's kernels variable (BackendInfo::kernels_variable) pins that backend's kernels, and no other's.
TEST(Environment, KernelsVariablesPinTheirBackendOnly) {
  int checked = 0;
  for (const BackendInfo& b : registered_backends()) {
    if (b.kernels_variable.empty()) continue;
    const EnvVar v(b.kernels_variable.c_str(), "own");
    BackendOptions o;
    options_from_environment(o, b.name);
    EXPECT_EQ(o.kernels, b.kernels_variable_op.empty() ? "own" : b.kernels_variable_op + "=own") << b.name;
    EXPECT_EQ(o.kernels_source, b.kernels_variable) << b.name;  // named by the backend's error for a bad value
    BackendOptions other;
    options_from_environment(other, "reference");
    EXPECT_EQ(other.kernels, "") << b.kernels_variable << " pinned the reference backend";
    BackendOptions given;
    given.kernels = "given";
    options_from_environment(given, b.name);
    EXPECT_EQ(given.kernels, "given") << b.name << ": the caller's option wins";
    ++checked;
  }
  const bool has_kernel_choices = std::any_of(registered_backends().begin(), registered_backends().end(),
                                              [](const BackendInfo& b) { return b.kernel_choices; });
  if (has_kernel_choices) EXPECT_GT(checked, 0) << "a backend with kernel choices declares no variable";
  if (checked == 0) GTEST_SKIP() << "no backend of this build declares a kernels variable (a reference-only build)";
}

TEST(Environment, CudaGraphsAndCublasLtPath) {
  BackendOptions o;
  {
    const EnvVar r("ALPAMAYO_CUDA_GRAPHS", "0"), l("ALPAMAYO_CUBLASLT", "/opt/cuda/lib64/libcublasLt.so.13");
    options_from_environment(o, "cuda");
  }
  EXPECT_FALSE(o.graphs);
  EXPECT_EQ(o.cublaslt_path, "/opt/cuda/lib64/libcublasLt.so.13");
  const EnvVar r("ALPAMAYO_CUDA_GRAPHS", "1"), l("ALPAMAYO_CUBLASLT", "/elsewhere/libcublasLt.so.13");
  BackendOptions on;
  options_from_environment(on, "cuda");
  EXPECT_TRUE(on.graphs);
  options_from_environment(o, "cuda");  // what the caller set stays
  EXPECT_FALSE(o.graphs);
  EXPECT_EQ(o.cublaslt_path, "/opt/cuda/lib64/libcublasLt.so.13");
}

}  // namespace
}  // namespace alpamayo
