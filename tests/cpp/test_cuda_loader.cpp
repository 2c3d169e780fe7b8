// cuBLASLt, loaded on first use (src/backends/cuda/cublaslt_loader.h): the forwarding functions reach the real
// library where it is installed, and a missing library is named, with every function failing cleanly. Neither
// needs a GPU: the calls below are cuBLASLt's host-side descriptor functions.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/cublaslt_loader.h"

namespace alpamayo {
namespace {

TEST(CublasLtLoader, ForwardsToTheInstalledLibrary) {
  if (const std::string why = cuda::lt::load(""); !why.empty()) GTEST_SKIP() << why;
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), CUBLAS_STATUS_SUCCESS);
  // A wrong size is the library's own check, so this call reached it.
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, 1), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 128, 64, 128), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const size_t ws = 1 << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

// In a fresh process (the library is loaded once per process): the path given names a file that is not there.
TEST(CublasLtLoader, AMissingLibraryIsNamedAndEveryCallFails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::fprintf(stderr, "unavailable: %s\n", cuda::lt::load("/nonexistent/libcublasLt.so.99").c_str());
        std::fprintf(stderr, "status string: %s\n", cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED));
        cublasLtHandle_t h = nullptr;
        cublasLtMatmulDesc_t d = nullptr;
        cublasLtMatmulPreference_t p = nullptr;
        const bool all_fail = cublasLtCreate(&h) == CUBLAS_STATUS_NOT_INITIALIZED &&
                              cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
                                  CUBLAS_STATUS_NOT_INITIALIZED &&
                              cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_NOT_INITIALIZED &&
                              std::string(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS)) ==
                                  "CUBLAS_STATUS_NOT_INITIALIZED" &&
                              h == nullptr && d == nullptr && p == nullptr;
        std::exit(all_fail ? 3 : 4);
      },
      ::testing::ExitedWithCode(3),
      "unavailable: cuBLASLt \\(/nonexistent/libcublasLt.so.99\\) could not be loaded: /nonexistent/libcublasLt.so.99.*"
      "cublaslt_path.*\nstatus string: cuBLASLt \\(/nonexistent");
}

// Which library: the path given when not empty, else the soname of the headers' major version.
TEST(CublasLtLoader, LibraryNameFollowsThePath) {
  EXPECT_EQ(cuda::lt::library_name(""), "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
  EXPECT_EQ(cuda::lt::library_name("/opt/cuda/lib64/libcublasLt.so.13"), "/opt/cuda/lib64/libcublasLt.so.13");
}

// One cuBLASLt per process: once one is loaded (or failed), an empty path takes it, another path is refused.
TEST(CublasLtLoader, OneLibraryPerProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::string first = cuda::lt::load("/nonexistent/a/libcublasLt.so.99");
        const std::string again = cuda::lt::load("");
        const std::string same = cuda::lt::load("/nonexistent/a/libcublasLt.so.99");
        const std::string other = cuda::lt::load("/nonexistent/b/libcublasLt.so.99");
        std::fprintf(stderr, "other: %s\n", other.c_str());
        std::exit(!first.empty() && again == first && same == first ? 3 : 4);
      },
      ::testing::ExitedWithCode(3),
      "other: cuBLASLt \\(/nonexistent/b/libcublasLt.so.99\\) cannot be loaded: this process already loaded "
      "/nonexistent/a/libcublasLt.so.99 \\(which failed\\)");
}

}  // namespace
}  // namespace alpamayo
