// options_from_environment (alpamayo/environment.h): the variables the programs' boundary turns into
// BackendOptions, where the caller left an option at its default.
#include <gtest/gtest.h>

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

TEST(Environment, CudaGemmIsAKernelPinForTheCudaBackendOnly) {
  const EnvVar g("ALPAMAYO_CUDA_GEMM", "own");
  BackendOptions o;
  options_from_environment(o, "cuda");
  EXPECT_EQ(o.kernels, "gemm=own");
  BackendOptions other;
  options_from_environment(other, "reference");
  EXPECT_EQ(other.kernels, "");
  BackendOptions dflt;  // the default backend
  options_from_environment(dflt);
  EXPECT_EQ(dflt.kernels, backend_names().front() == "cuda" ? "gemm=own" : "");
  BackendOptions given;
  given.kernels = "gemm=cublaslt";
  options_from_environment(given, "cuda");
  EXPECT_EQ(given.kernels, "gemm=cublaslt");
  const EnvVar bad("ALPAMAYO_CUDA_GEMM", "fast");
  test::expect_error([] { BackendOptions b; options_from_environment(b, "cuda"); },
                     {"ALPAMAYO_CUDA_GEMM", "expected cublaslt or own", "'fast'"});
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
