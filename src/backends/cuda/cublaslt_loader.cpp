// The cuBLASLt functions the cuda backend calls (cublaslt_loader.h), each resolved in the library loaded on first
// use. Their declarations come from cublasLt.h, so a signature that drifts from the headers does not compile.
#include "backends/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace alpamayo::cuda_lt {
namespace {

struct Library {
  void* handle = nullptr;
  std::string error;  // why handle is null
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    std::vector<std::string> tries{library_name()};
#ifdef ALPAMAYO_CUDA_LIBRARY_DIR
    // Where the toolkit the build found keeps it, for machines whose loader path does not list that folder
    // (what an RPATH to it did when the library was linked).
    if (tries[0].find('/') == std::string::npos) tries.push_back(std::string(ALPAMAYO_CUDA_LIBRARY_DIR) + "/" + tries[0]);
#endif
    std::string errors;
    for (const std::string& name : tries) {
      dlerror();
      if ((l.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL))) return l;
      const char* e = dlerror();
      errors += std::string(errors.empty() ? "" : "; ") + (e ? e : name + ": not loaded");
    }
    l.error = "cuBLASLt (" + tries[0] + ") could not be loaded: " + errors +
              " (install the CUDA toolkit's cuBLAS, or set ALPAMAYO_CUBLASLT to the library's path)";
    return l;
  }();
  return lib;
}

// The library's function `name`, with the type of our declaration of it; null where the library is missing or
// lacks it (an older cuBLASLt).
template <class F>
F* resolve(const char* name) {
  const Library& l = library();
  return l.handle ? reinterpret_cast<F*>(dlsym(l.handle, name)) : nullptr;
}

}  // namespace

std::string library_name() {
  const char* env = std::getenv("ALPAMAYO_CUBLASLT");
  if (env && *env) return env;
  return "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
}

const std::string& unavailable() { return library().error; }

}  // namespace alpamayo::cuda_lt

using alpamayo::cuda_lt::resolve;

// Each forwards to the library's function of the same name, or reports CUBLAS_STATUS_NOT_INITIALIZED.
#define ALP_LT_FORWARD(fn, ...)                                   \
  static auto* const f = resolve<decltype(fn)>(#fn);              \
  return f ? f(__VA_ARGS__) : CUBLAS_STATUS_NOT_INITIALIZED

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* h) { ALP_LT_FORWARD(cublasLtCreate, h); }
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t h) { ALP_LT_FORWARD(cublasLtDestroy, h); }

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t s) {
  static auto* const f = resolve<decltype(cublasLtGetStatusName)>("cublasLtGetStatusName");
  return f ? f(s) : "CUBLAS_STATUS_NOT_INITIALIZED";
}
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t s) {
  static auto* const f = resolve<decltype(cublasLtGetStatusString)>("cublasLtGetStatusString");
  if (f) return f(s);
  const std::string& why = alpamayo::cuda_lt::unavailable();
  return why.empty() ? "the loaded cuBLASLt has no cublasLtGetStatusString" : why.c_str();
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t c,
                                                     cudaDataType_t s) {
  ALP_LT_FORWARD(cublasLtMatmulDescCreate, d, c, s);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  ALP_LT_FORWARD(cublasLtMatmulDescDestroy, d);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                           const void* buf, size_t bytes) {
  ALP_LT_FORWARD(cublasLtMatmulDescSetAttribute, d, a, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType t, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  ALP_LT_FORWARD(cublasLtMatrixLayoutCreate, l, t, rows, cols, ld);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  ALP_LT_FORWARD(cublasLtMatrixLayoutDestroy, l);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  ALP_LT_FORWARD(cublasLtMatmulPreferenceCreate, p);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  ALP_LT_FORWARD(cublasLtMatmulPreferenceDestroy, p);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                 cublasLtMatmulPreferenceAttributes_t a,
                                                                 const void* buf, size_t bytes) {
  ALP_LT_FORWARD(cublasLtMatmulPreferenceSetAttribute, p, a, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                           cublasLtMatmulPreference_t p, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* found) {
  ALP_LT_FORWARD(cublasLtMatmulAlgoGetHeuristic, h, d, a, b, c, dl, p, requested, results, found);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                                           cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  ALP_LT_FORWARD(cublasLtMatmul, h, d, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                 workspace_bytes, stream);
}

}  // extern "C"
