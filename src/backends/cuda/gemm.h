// The expert's weight matmuls through cuBLASLt: Y [M, N] (fp32) = X [M, K] W^T with W [N, K] as stored
// (PyTorch [out, in]), bf16 x bf16 or fp8 e4m3 x e4m3 with fp32 accumulation. In cuBLAS's column-major
// terms this is D (N x M) = W^T-op (N x K) * X (K x M): the "TN" form fp8 requires, with the weight's
// large N as cuBLAS's m and the 64*B token rows as n (the swap-AB arrangement for skinny M).
// Descriptors, layouts and the algorithm are chosen once per bind (per M), never per call.
#pragma once
#include <string>

#include "backends/cuda/cuda_api.h"
#include "backends/cuda/kernels.h"

namespace alpamayo::ALP_CUDA_NS {

struct DeviceLinear;

class LtMatmul {
 public:
  LtMatmul() = default;
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Plans Y [M, N] = X [M, K] W^T; `name` appears in errors. Throws Error when cuBLASLt offers no
  // algorithm for the shape (workspace: at most ws_bytes).
  void plan(cublasLtHandle_t lt, bool fp8, int N, int K, int M, size_t ws_bytes, const std::string& name);
  void run(cublasLtHandle_t lt, const void* W, const void* X, float* Y, void* ws, size_t ws_bytes,
           cudaStream_t s) const;
  bool planned() const { return desc_ != nullptr; }

 private:
  void reset();
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  std::string name_;
};

// How the weight matmuls run (chosen per model; ALPAMAYO_CUDA_GEMM=cublaslt|own overrides the default):
//   Lt   cuBLASLt. bf16 x bf16, or fp8 x fp8 (W8A8: activations quantized per row to e4m3).
//   Own  skinny_gemm.cu: bf16 activations against bf16 or fp8 weights (W8A16), split-K.
enum class GemmImpl { Lt, Own };
const char* gemm_impl_name(GemmImpl g);

// One weight matmul shape of a binding: Y = X W^T for M token rows, planned once per bind.
class Matmul {
 public:
  void plan(GemmImpl impl, cublasLtHandle_t lt, bool fp8, int N, int K, int Mp, int M, int sm_count, size_t ws_bytes,
            const std::string& name);
  // Enqueues the product of X (bf16, or e4m3 with row scales x_rs for Lt fp8) and w into Y; returns how the
  // consumers read Y (splits and scales).
  MatOut run(cublasLtHandle_t lt, const DeviceLinear& w, const void* X, const float* x_rs, float* Y, void* ws,
             size_t ws_bytes, cudaStream_t s) const;
  // Floats of Y this matmul writes (split-K partials included).
  size_t out_floats() const;
  int splits() const { return impl_ == GemmImpl::Own ? own_.splits : 1; }

 private:
  GemmImpl impl_ = GemmImpl::Lt;
  int N_ = 0, Mp_ = 0;
  LtMatmul lt_;
  SkinnyPlan own_;
};

// Throws alpamayo::Error naming the call unless s == CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t s, const std::string& what);

}  // namespace alpamayo::ALP_CUDA_NS
