#include "backends/cuda/gemm.h"

#include "alpamayo/error.h"
#include "backends/cuda/cuda_model.h"

namespace alpamayo::ALP_CUDA_NS {

void check_cublas(cublasStatus_t s, const std::string& what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::Internal, "cuda backend: " + what + " failed: cuBLASLt status " + std::to_string(static_cast<int>(s)) + " (" +
              cublasLtGetStatusName(s) + ": " + cublasLtGetStatusString(s) + ")");
}

LtMatmul::~LtMatmul() { reset(); }

void LtMatmul::reset() {
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (d_) cublasLtMatrixLayoutDestroy(d_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  a_ = b_ = d_ = nullptr;
  desc_ = nullptr;
}

void LtMatmul::plan(cublasLtHandle_t lt, bool fp8, int N, int K, int M, size_t ws_bytes, const std::string& name) {
  reset();
  name_ = name;
  const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  check_cublas(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), name + ": cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), name + ": TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), name + ": TRANSB");
  // A = W as K x N column-major (= [N, K] row-major), transposed; B = X as K x M; D = Y^T as N x M.
  check_cublas(cublasLtMatrixLayoutCreate(&a_, in, K, N, K), name + ": layout A");
  check_cublas(cublasLtMatrixLayoutCreate(&b_, in, K, M, K), name + ": layout B");
  check_cublas(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, N, M, N), name + ": layout D");

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), name + ": preference");
  cublasLtMatmulHeuristicResult_t res[8] = {};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(lt, desc_, a_, b_, d_, d_, pref, 8, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_cublas(st, name + ": cublasLtMatmulAlgoGetHeuristic");
  int pick = -1;
  for (int i = 0; i < found && pick < 0; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) pick = i;
  if (pick < 0)
    throw Error(ErrorCode::Unsupported, "cuda backend: cuBLASLt has no " + std::string(fp8 ? "fp8 e4m3" : "bf16") + " algorithm for " + name +
                " (N=" + std::to_string(N) + ", K=" + std::to_string(K) + ", M=" + std::to_string(M) + ") on this GPU");
  algo_ = res[pick].algo;
}

void LtMatmul::run(cublasLtHandle_t lt, const void* W, const void* X, float* Y, void* ws, size_t ws_bytes,
                   cudaStream_t s) const {
  const float alpha = 1.f, beta = 0.f;
  check_cublas(cublasLtMatmul(lt, desc_, &alpha, W, a_, X, b_, &beta, Y, d_, Y, d_, &algo_, ws, ws_bytes, s),
               name_ + ": cublasLtMatmul");
}

const char* gemm_impl_name(GemmImpl g) { return g == GemmImpl::Lt ? "cublaslt" : "own"; }

void Matmul::plan(GemmImpl impl, cublasLtHandle_t lt, bool fp8, int N, int K, int Mp, int M, int sm_count,
                  size_t ws_bytes, const std::string& name) {
  impl_ = impl;
  N_ = N;
  Mp_ = Mp;
  if (impl == GemmImpl::Lt)
    lt_.plan(lt, fp8, N, K, Mp, ws_bytes, name);
  else
    own_ = plan_skinny_gemm(N, K, M, sm_count, fp8);
}

MatOut Matmul::run(cublasLtHandle_t lt, const DeviceLinear& w, const void* X, const float* x_rs, float* Y, void* ws,
                   size_t ws_bytes, cudaStream_t s) const {
  MatOut o;
  o.y = Y;
  o.ld = N_;
  o.cs = w.col_scale();
  if (impl_ == GemmImpl::Lt) {
    lt_.run(lt, w.w.get(), X, Y, ws, ws_bytes, s);
    o.rs = x_rs;
  } else {
    const size_t stride = size_t(Mp_) * N_;
    skinny_gemm(s, own_, static_cast<const uint16_t*>(X), w.w.get(), Y, stride);
    o.splits = own_.splits;
    o.stride = stride;
  }
  return o;
}

size_t Matmul::out_floats() const { return size_t(splits()) * Mp_ * N_; }

}  // namespace alpamayo::ALP_CUDA_NS
