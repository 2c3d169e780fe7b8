// A fake CUDA runtime and cuBLASLt for tests: over it the whole cuda backend (model, session, graphs, matmul
// plans, launchers) compiles for the host as the test-only cuda_emu backend (CMakeLists.txt here), "device"
// memory is host memory, kernels run in the SIMT emulator (simt_emu.h, launched through
// include/backends/cuda/device_api.h), and cuBLASLt matmuls are computed naively from their descriptors and
// layouts. So the conformance suite runs the backend's own orchestration on a machine without a GPU.
//
// Semantics: one fake device (sm_90, 4 SMs); stream work runs at once, in order, on the calling thread,
// except while the stream captures, when it is recorded into the graph and runs at each launch; events read
// the host clock. The real runtime's names are macros for the fakes from here on (after the real headers,
// whose include guards keep them from being read again), which sidesteps overloading against them.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace fake_cuda {

struct Graph {
  std::vector<std::function<void()>> ops;
};
struct Stream {
  Graph* capture = nullptr;  // the graph being captured, if any
};
struct Event {
  std::chrono::steady_clock::time_point t{};
};
struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Desc {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};

inline std::mutex& mutex() {
  static std::mutex m;
  return m;
}
inline std::map<uintptr_t, size_t>& allocations() {
  static std::map<uintptr_t, size_t> a;
  return a;
}

// What the tests count: stream captures begun, graph launches, and kernels launched outside a capture.
struct Counters {
  std::atomic<long> captures{0}, graph_launches{0}, eager_kernels{0};
};
inline Counters& counters() {
  static Counters c;
  return c;
}
inline bool capturing(cudaStream_t s) {
  const Stream* st = reinterpret_cast<const Stream*>(s);
  return st && st->capture;
}

// Runs op now, or records it into the graph the stream is capturing.
inline void enqueue(cudaStream_t s, std::function<void()> op) {
  Stream* st = reinterpret_cast<Stream*>(s);
  if (st && st->capture)
    st->capture->ops.push_back(std::move(op));
  else
    op();
}

inline const char* GetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }
inline const char* GetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake runtime error"; }
inline cudaError_t GetLastError() { return cudaSuccess; }
inline cudaError_t GetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t SetDevice(int) { return cudaSuccess; }
inline cudaError_t GetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
// The pretended GPU: tests may set another compute capability (the fp8 refusal below sm_89).
struct Device {
  int major = 9, minor = 0;
  const char* name = "fake GPU";
};
inline Device& device() {
  static Device d;
  return d;
}
inline cudaError_t DeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrMultiProcessorCount      ? 4
       : a == cudaDevAttrComputeCapabilityMajor ? device().major
       : a == cudaDevAttrComputeCapabilityMinor ? device().minor
                                                : 0;
  return cudaSuccess;
}
inline cudaError_t GetDeviceProperties(cudaDeviceProp* p, int) {
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "%s", device().name);
  p->major = device().major;
  p->minor = device().minor;
  return cudaSuccess;
}
inline cudaError_t DeviceSynchronize() { return cudaSuccess; }

inline cudaError_t Malloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  std::lock_guard<std::mutex> g(mutex());
  allocations()[reinterpret_cast<uintptr_t>(*p)] = n;
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t Free(void* p) {
  {
    std::lock_guard<std::mutex> g(mutex());
    allocations().erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t MallocHost(void** p, size_t n) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t FreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
// Memory returned by Malloc is "device" memory of device 0; anything else is unregistered host memory.
inline cudaError_t PointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = cudaPointerAttributes{};
  a->type = cudaMemoryTypeUnregistered;
  std::lock_guard<std::mutex> g(mutex());
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = allocations().upper_bound(u);
  if (it != allocations().begin() && u < std::prev(it)->first + std::prev(it)->second) {
    a->type = cudaMemoryTypeDevice;
    a->device = 0;
  }
  return cudaSuccess;
}

inline cudaError_t Memcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t MemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t st) {
  enqueue(st, [=] { std::memcpy(d, s, n); });
  return cudaSuccess;
}
inline cudaError_t MemsetAsync(void* d, int v, size_t n, cudaStream_t st) {
  enqueue(st, [=] { std::memset(d, v, n); });
  return cudaSuccess;
}

inline cudaError_t StreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new Stream);
  return cudaSuccess;
}
inline cudaError_t StreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<Stream*>(s);
  return cudaSuccess;
}
inline cudaError_t StreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t StreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  ++counters().captures;
  reinterpret_cast<Stream*>(s)->capture = new Graph;
  return cudaSuccess;
}
inline cudaError_t StreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  Stream* st = reinterpret_cast<Stream*>(s);
  *g = reinterpret_cast<cudaGraph_t>(st->capture);
  st->capture = nullptr;
  return cudaSuccess;
}
inline cudaError_t GraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
  *e = reinterpret_cast<cudaGraphExec_t>(new Graph(*reinterpret_cast<Graph*>(g)));
  return cudaSuccess;
}
inline cudaError_t GraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  ++counters().graph_launches;
  for (auto& op : reinterpret_cast<Graph*>(e)->ops) enqueue(s, op);
  return cudaSuccess;
}
inline cudaError_t GraphDestroy(cudaGraph_t g) {
  delete reinterpret_cast<Graph*>(g);
  return cudaSuccess;
}
inline cudaError_t GraphExecDestroy(cudaGraphExec_t e) {
  delete reinterpret_cast<Graph*>(e);
  return cudaSuccess;
}

inline cudaError_t EventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
inline cudaError_t EventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Event*>(e);
  return cudaSuccess;
}
inline cudaError_t EventRecord(cudaEvent_t e, cudaStream_t s) {
  Event* ev = reinterpret_cast<Event*>(e);
  enqueue(s, [ev] { ev->t = std::chrono::steady_clock::now(); });
  return cudaSuccess;
}
inline cudaError_t EventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned) { return EventRecord(e, s); }
inline cudaError_t EventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms =
      std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(b)->t - reinterpret_cast<Event*>(a)->t).count();
  return cudaSuccess;
}

template <class F>
cudaError_t FuncSetAttribute(F, cudaFuncAttribute, int) {
  return cudaSuccess;
}
template <class F>
cudaError_t FuncGetAttributes(cudaFuncAttributes* a, F) {
  *a = cudaFuncAttributes{};
  return cudaSuccess;
}
template <class F>
cudaError_t OccupancyMaxActiveBlocksPerMultiprocessor(int* n, F, int, size_t) {
  *n = 1;
  return cudaSuccess;
}

// cuBLASLt: descriptors and layouts are remembered; a matmul is computed naively from them.
inline cublasStatus_t LtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtDestroy(cublasLtHandle_t h) {
  delete reinterpret_cast<int*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
inline const char* LtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_FAKE"; }
inline const char* LtGetStatusString(cublasStatus_t) { return "fake cuBLASLt"; }
inline cublasStatus_t LtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t c, cudaDataType_t s) {
  if (c != CUBLAS_COMPUTE_32F || s != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(new Desc);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete reinterpret_cast<Desc*>(d);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* v,
                                               size_t) {
  Desc* ds = reinterpret_cast<Desc*>(d);
  if (a == CUBLASLT_MATMUL_DESC_TRANSA) ds->ta = *static_cast<const cublasOperation_t*>(v);
  if (a == CUBLASLT_MATMUL_DESC_TRANSB) ds->tb = *static_cast<const cublasOperation_t*>(v);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t t, uint64_t rows, uint64_t cols,
                                           int64_t ld) {
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{t, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete reinterpret_cast<Layout*>(l);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete reinterpret_cast<int*>(p);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                     const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t LtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                               cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                               cublasLtMatmulPreference_t, int n, cublasLtMatmulHeuristicResult_t* r,
                                               int* found) {
  if (n > 0) r[0].state = CUBLAS_STATUS_SUCCESS;
  *found = n > 0 ? 1 : 0;
  return CUBLAS_STATUS_SUCCESS;
}
inline float element(const void* p, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (t == CUDA_R_8F_E4M3) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(p)[i], __NV_E4M3);
    return __half2float(__half(h));
  }
  std::abort();
}
// D = alpha op(A) op(B) + beta C over column-major layouts (C == D here, fp32).
inline cublasStatus_t LtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                               cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const void* beta,
                               const void*, cublasLtMatrixLayout_t, void* D, cublasLtMatrixLayout_t ld,
                               const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t s) {
  const Desc ds = *reinterpret_cast<Desc*>(d);
  const Layout a = *reinterpret_cast<Layout*>(la), b = *reinterpret_cast<Layout*>(lb),
               o = *reinterpret_cast<Layout*>(ld);
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (o.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t m = o.rows, n = o.cols, k = ds.ta == CUBLAS_OP_T ? a.rows : a.cols;
  enqueue(s, [=] {
    float* out = static_cast<float*>(D);
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (uint64_t p = 0; p < k; ++p) {
          const size_t ai = ds.ta == CUBLAS_OP_T ? p + i * a.ld : i + p * a.ld;
          const size_t bi = ds.tb == CUBLAS_OP_T ? j + p * b.ld : p + j * b.ld;
          acc += double(element(A, a.type, ai)) * element(B, b.type, bi);
        }
        float& y = out[i + j * o.ld];
        y = float(al * acc + (be != 0.f ? be * y : 0.f));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace fake_cuda

#define cudaGetErrorName ::fake_cuda::GetErrorName
#define cudaGetErrorString ::fake_cuda::GetErrorString
#define cudaGetLastError ::fake_cuda::GetLastError
#define cudaGetDevice ::fake_cuda::GetDevice
#define cudaSetDevice ::fake_cuda::SetDevice
#define cudaGetDeviceCount ::fake_cuda::GetDeviceCount
#define cudaDeviceGetAttribute ::fake_cuda::DeviceGetAttribute
#define cudaGetDeviceProperties ::fake_cuda::GetDeviceProperties
#define cudaDeviceSynchronize ::fake_cuda::DeviceSynchronize
#define cudaMalloc ::fake_cuda::Malloc
#define cudaFree ::fake_cuda::Free
#define cudaMallocHost ::fake_cuda::MallocHost
#define cudaFreeHost ::fake_cuda::FreeHost
#define cudaPointerGetAttributes ::fake_cuda::PointerGetAttributes
#define cudaMemcpy ::fake_cuda::Memcpy
#define cudaMemcpyAsync ::fake_cuda::MemcpyAsync
#define cudaMemsetAsync ::fake_cuda::MemsetAsync
#define cudaStreamCreateWithFlags ::fake_cuda::StreamCreateWithFlags
#define cudaStreamDestroy ::fake_cuda::StreamDestroy
#define cudaStreamSynchronize ::fake_cuda::StreamSynchronize
#define cudaStreamBeginCapture ::fake_cuda::StreamBeginCapture
#define cudaStreamEndCapture ::fake_cuda::StreamEndCapture
#define cudaGraphInstantiate ::fake_cuda::GraphInstantiate
#define cudaGraphLaunch ::fake_cuda::GraphLaunch
#define cudaGraphDestroy ::fake_cuda::GraphDestroy
#define cudaGraphExecDestroy ::fake_cuda::GraphExecDestroy
#define cudaEventCreate ::fake_cuda::EventCreate
#define cudaEventDestroy ::fake_cuda::EventDestroy
#define cudaEventRecord ::fake_cuda::EventRecord
#define cudaEventRecordWithFlags ::fake_cuda::EventRecordWithFlags
#define cudaEventElapsedTime ::fake_cuda::EventElapsedTime
#define cudaFuncSetAttribute ::fake_cuda::FuncSetAttribute
#define cudaFuncGetAttributes ::fake_cuda::FuncGetAttributes
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor ::fake_cuda::OccupancyMaxActiveBlocksPerMultiprocessor
#define cublasLtCreate ::fake_cuda::LtCreate
#define cublasLtDestroy ::fake_cuda::LtDestroy
#define cublasLtGetStatusName ::fake_cuda::LtGetStatusName
#define cublasLtGetStatusString ::fake_cuda::LtGetStatusString
#define cublasLtMatmulDescCreate ::fake_cuda::LtMatmulDescCreate
#define cublasLtMatmulDescDestroy ::fake_cuda::LtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute ::fake_cuda::LtMatmulDescSetAttribute
#define cublasLtMatrixLayoutCreate ::fake_cuda::LtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy ::fake_cuda::LtMatrixLayoutDestroy
#define cublasLtMatmulPreferenceCreate ::fake_cuda::LtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy ::fake_cuda::LtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute ::fake_cuda::LtMatmulPreferenceSetAttribute
#define cublasLtMatmulAlgoGetHeuristic ::fake_cuda::LtMatmulAlgoGetHeuristic
#define cublasLtMatmul ::fake_cuda::LtMatmul
