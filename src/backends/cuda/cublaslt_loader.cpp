// The cuBLASLt functions the cuda backend calls (cublaslt_loader.h), each resolved in the library loaded on first
// use. Their declarations come from cublasLt.h, so a signature that drifts from the headers does not compile.
#include "backends/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace alpamayo::ALP_CUDA_NS::lt {
namespace {

struct Library {
  bool tried = false;
  std::string name;   // the library loaded or tried
  void* handle = nullptr;
  std::string error;  // why handle is null
};

std::mutex& library_mutex() {
  static std::mutex m;
  return m;
}
Library& library() {
  static Library lib;
  return lib;
}

// Opens `name`, then (a bare file name) the toolkit's copy; l.handle or l.error.
void open_library(Library& l, const std::string& name) {
  l.tried = true;
  l.name = name;
  std::vector<std::string> tries{name};
#ifdef ALPAMAYO_CUDA_LIBRARY_DIR
  // Where the toolkit the build found keeps it, for machines whose loader path does not list that folder
  // (what an RPATH to it did when the library was linked).
  if (name.find('/') == std::string::npos) tries.push_back(std::string(ALPAMAYO_CUDA_LIBRARY_DIR) + "/" + name);
#endif
  std::string errors;
  for (const std::string& n : tries) {
    dlerror();
    if ((l.handle = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) return;
    const char* e = dlerror();
    errors += std::string(errors.empty() ? "" : "; ") + (e ? e : n + ": not loaded");
  }
  l.error = "cuBLASLt (" + name + ") could not be loaded: " + errors +
            " (install the CUDA toolkit's cuBLAS, or name the library's path: BackendOptions::cublaslt_path, "
            "ALPAMAYO_CUBLASLT)";
}

// The library's function `name`, with the type of our declaration of it; null where the library is missing or
// lacks it (an older cuBLASLt).
template <class F>
F* resolve(const char* name) {
  load("");
  const Library& l = library();
  return l.handle ? reinterpret_cast<F*>(dlsym(l.handle, name)) : nullptr;
}

}  // namespace

std::string library_name(const std::string& path) {
  if (!path.empty()) return path;
  return "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
}

std::string load(const std::string& path) {
  std::lock_guard<std::mutex> g(library_mutex());
  Library& l = library();
  if (!l.tried) open_library(l, library_name(path));
  else if (!path.empty() && path != l.name)
    return "cuBLASLt (" + path + ") cannot be loaded: this process already loaded " + l.name +
           (l.handle ? "" : " (which failed)") + ", and holds one cuBLASLt";
  return l.error;
}

// The reason the forwarding functions fail, for cublasLtGetStatusString: kept alive with the library state.
const char* load_error() {
  load("");
  return library().error.c_str();
}

}  // namespace alpamayo::ALP_CUDA_NS::lt

using alpamayo::ALP_CUDA_NS::lt::resolve;

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
  const char* why = alpamayo::ALP_CUDA_NS::lt::load_error();
  return *why ? why : "the loaded cuBLASLt has no cublasLtGetStatusString";
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
