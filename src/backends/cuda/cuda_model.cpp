// The backend's registry entry, the availability probe and CudaModel (weight upload).
#include "backends/cuda/cuda_model.h"

#include <algorithm>
#include <sstream>

#include "alpamayo/error.h"
#include "backends/cuda/cublaslt_loader.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_session.h"
#include "backends/cuda/kernels.h"
#include "model/fourier.h"

namespace alpamayo::ALP_CUDA_NS {

namespace {

// The current device's compute capability (major * 10 + minor) and name, for the probes' messages.
struct Gpu {
  int dev = 0, cc = 0;
  std::string name;
};
Gpu current_gpu() {
  Gpu g;
  int major = 0, minor = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&g.dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, g.dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, g.dev) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, g.dev) != cudaSuccess) {
    (void)cudaGetLastError();
    g.cc = -1;
    return g;
  }
  g.cc = major * 10 + minor;
  g.name = prop.name;
  return g;
}
std::string describe(const Gpu& g) {
  return "cuda:" + std::to_string(g.dev) + " (" + g.name + ", compute capability " + std::to_string(g.cc / 10) + "." +
         std::to_string(g.cc % 10) + ")";
}

}  // namespace

// The kernels need sm_80 (bf16 mma.sync, cp.async); fp8 e4m3 weights sm_89 (the generation with fp8 hardware,
// where e4m3 is a supported storage format).
std::string format_unavailable(const std::string& format) {
  if (format != "fp8") return std::string();
  const Gpu g = current_gpu();
  if (g.cc < 0) return std::string("cannot query the CUDA device's compute capability");
  if (g.cc >= 89) return std::string();
  return "fp8 weights (e4m3) need compute capability 8.9 or newer (sm_89+); " + describe(g) +
         " runs bf16 weights";
}

std::string unavailable() {
  static const std::string why = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return std::string("no usable CUDA driver or device (cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
             cudaGetErrorString(e) + ")";
    }
    if (n == 0) return std::string("no CUDA device");
    const Gpu g = current_gpu();
    if (g.cc < 0) return std::string("cannot query the CUDA device's compute capability");
    if (g.cc < 80) return "CUDA device " + describe(g) + ": the cuda backend needs compute capability 8.0 or newer (sm_80+)";
    return std::string();
  }();
  return why;
}

std::unique_ptr<BackendModel> load_backend(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts) {
  return std::make_unique<CudaModel>(cfg, w, opts);
}

BackendInfo backend_info() {
  BackendInfo b;
  b.name = "cuda";
  b.weight_formats = {"bf16", "fp8"};
  b.kv_formats = {"bf16"};
  b.load = load_backend;
  b.unavailable = unavailable;
  b.format_unavailable = format_unavailable;
  b.kernel_choices = true;  // the weight matmuls: "gemm=cublaslt" or "gemm=own"
  b.kernels_variable = "ALPAMAYO_CUDA_GEMM";
  b.kernels_variable_op = "gemm";
  // Weights live in device memory (the backend checks that memory itself); the host holds only the action
  // projections, which every backend's estimate counts. Shared prompts run as a cascade (attention.cuh), guidance
  // as a second pass of the layers in the same graph (docs/CUDA_BACKEND.md).
  b.features.shared_prompts = true;
  b.features.suffix_rows = true;
  b.features.left_padding = true;
  b.features.guidance = true;
  b.features.device_memory = true;
  // Strided and paged caches are read in place through their views (KVView, kernels.h); host ones are gathered.
  b.features.strided_cache = true;
  b.features.paged_cache = true;
  // A prompt read by all B samples is one work item of B * group * T query rows, in 128-row tiles on the
  // attention grid's z dimension (at most 65535).
  b.features.max_batch = [](const ExpertConfig& c) {
    return int64_t(65535) * kAttnRowsPerCta / std::max(1, c.Hq / std::max(1, c.Hkv) * c.T);
  };
  return b;
}

namespace {

// BackendOptions::kernels for this backend: "gemm=cublaslt" or "gemm=own"; empty keeps `dflt`.
// source: where the kernels came from ("" for the option, else the variable that filled it), for the message.
GemmImpl parse_gemm_choice(const std::string& kernels, const std::string& source, GemmImpl dflt) {
  GemmImpl g = dflt;
  std::stringstream in(kernels);
  for (std::string item; std::getline(in, item, ',');) {
    check(item == "gemm=cublaslt" || item == "gemm=own", ErrorCode::Unsupported,
          "cuda backend: kernels \"" + kernels + "\"" + (source.empty() ? "" : " (from " + source + ")") +
              ": expected gemm=cublaslt or gemm=own, found '" + item + "'");
    g = item == "gemm=own" ? GemmImpl::Own : GemmImpl::Lt;
  }
  return g;
}

}  // namespace

std::string CudaModel::kernels() const { return gemm_ == GemmImpl::Own ? "gemm=own" : "gemm=cublaslt"; }

CudaModel::CudaModel(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts)
    : cfg_(cfg), fp8_(opts.weights == "fp8") {
  const int D = cfg.D, Hq = cfg.Hq, Hkv = cfg.Hkv, d = cfg.d, I = cfg.I;
  check(d % 8 == 0 && d <= kAttnMaxHeadDim, ErrorCode::Unsupported, "cuda backend: the head dim must be a multiple of 8 and at most " +
                                                std::to_string(kAttnMaxHeadDim) + ", found " + std::to_string(d));
  const int align = fp8_ ? 16 : 8;  // matmul K dimensions: 16-byte rows
  for (const auto& [name, k] : {std::pair<const char*, int>{"hidden size D", D}, {"MLP width I", I}})
    check(k % align == 0, ErrorCode::Unsupported, std::string("cuda backend: the ") + name + " must be a multiple of " + std::to_string(align) +
                              " for " + (fp8_ ? "fp8" : "bf16") + " matmuls, found " + std::to_string(k));
  check(Hq * d % align == 0, ErrorCode::Unsupported,
        "cuda backend: Hq * d must be a multiple of " + std::to_string(align) + ", found " + std::to_string(Hq * d));
  use_graphs_ = opts.graphs;
  // bf16 through cuBLASLt; fp8 through our W8A16 kernel, which keeps the activations in bf16 (cuBLASLt's
  // fp8 path needs e4m3 activations too, which measured too inaccurate: docs/CUDA_BACKEND.md).
  gemm_ = parse_gemm_choice(opts.kernels, opts.kernels_source, fp8_ ? GemmImpl::Own : GemmImpl::Lt);
  // Every session creates a cuBLASLt handle, whichever matmul it runs.
  if (const std::string why = lt::load(opts.cublaslt_path); !why.empty()) throw Error("cuda backend: " + why);

  ALP_CUDA(cudaGetDevice(&device_));
  if (fp8_)
    if (const std::string why = format_unavailable("fp8"); !why.empty())
      throw Error(ErrorCode::Unsupported, "cuda backend: " + why);
  ALP_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  attn_ctas_per_sm_ = prepare_kernels();

  DeviceBuffer staging;  // fp32 weights on their way to e4m3
  layers_.resize(cfg.L);
  for (int l = 0; l < cfg.L; ++l) {
    const LayerWeights& lw = w.expert.layers[l];
    DeviceLayer& out = layers_[l];
    out.input_norm = upload_f32(lw.input_norm);
    out.post_norm = upload_f32(lw.post_norm);
    out.q_norm = upload_f32(lw.q_norm);
    out.k_norm = upload_f32(lw.k_norm);
    out.qkv = upload_linear({&lw.q, &lw.k, &lw.v}, staging);
    out.o = upload_linear({&lw.o}, staging);
    out.gate_up = upload_linear({&lw.gate, &lw.up}, staging);
    out.down = upload_linear({&lw.down}, staging);
  }
  final_norm_ = upload_f32(w.expert.final_norm);
  (void)Hkv;

  const ActionInProjWeights& a = w.action_in;
  if (a.freqs.empty()) {
    const std::vector<float> f = fourier_freqs(cfg.n_fourier, cfg.max_freq, !opts.exact_freqs);
    std::vector<float> all;
    for (int i = 0; i <= cfg.A; ++i) all.insert(all.end(), f.begin(), f.end());
    proj_.freqs = upload_f32(all);
  } else {
    std::vector<float> all;
    for (const TensorView& f : a.freqs) {
      const std::vector<float> v = to_f32(f);
      all.insert(all.end(), v.begin(), v.end());
    }
    proj_.freqs = upload_f32(all);
  }
  for (size_t i = 0; i < a.linear_w.size(); ++i) {
    proj_.trunk_w.push_back(upload_f32(a.linear_w[i]));
    proj_.trunk_b.push_back(upload_f32(a.linear_b[i]));
    proj_.trunk_out.push_back(static_cast<int>(a.linear_w[i].shape[0]));
    proj_.trunk_in.push_back(static_cast<int>(a.linear_w[i].shape[1]));
  }
  for (const TensorView& n : a.norm_w) proj_.trunk_norm.push_back(upload_f32(n));
  proj_.ln_w = upload_f32(a.ln_w);
  proj_.ln_b = upload_f32(a.ln_b);
  proj_.out_w = upload_f32(w.action_out.w);
  proj_.out_b = upload_f32(w.action_out.b);
  ALP_CUDA(cudaDeviceSynchronize());  // the fp8 quantization kernels ran on the legacy stream
}

bool CudaModel::can_read(const Device& dev) const {
  return dev.host_accessible() || (dev.type == DeviceType::CUDA && dev.id == device_);
}

std::unique_ptr<BackendSession> CudaModel::new_session() const { return std::make_unique<CudaSession>(*this); }

DeviceBuffer CudaModel::upload_f32(const std::vector<float>& v) {
  DeviceBuffer b(v.size() * sizeof(float));
  ALP_CUDA(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice));
  bytes_ += b.bytes();
  return b;
}

DeviceBuffer CudaModel::upload_f32(const TensorView& t) { return upload_f32(to_f32(t)); }

DeviceLinear CudaModel::upload_linear(const std::vector<const TensorView*>& parts, DeviceBuffer& staging) {
  DeviceLinear lin;
  lin.K = static_cast<int>(parts[0]->shape[1]);
  for (const TensorView* p : parts) lin.N += static_cast<int>(p->shape[0]);
  const size_t n = size_t(lin.N) * lin.K;
  if (!fp8_) {
    std::vector<uint16_t> host(n);
    size_t off = 0;
    for (const TensorView* p : parts) {
      convert_to_bf16(*p, host.data() + off);
      off += p->numel();
    }
    lin.w = DeviceBuffer(n * sizeof(uint16_t));
    ALP_CUDA(cudaMemcpy(lin.w.get(), host.data(), lin.w.bytes(), cudaMemcpyHostToDevice));
    bytes_ += lin.w.bytes();
    return lin;
  }
  // fp8: the checkpoint's values in fp32 go up once, and are quantized per output channel on the device.
  std::vector<float> host(n);
  size_t off = 0;
  for (const TensorView* p : parts) {
    convert_to_f32(*p, host.data() + off);
    off += p->numel();
  }
  if (staging.bytes() < n * sizeof(float)) {
    ALP_CUDA(cudaDeviceSynchronize());  // earlier quantizations may still read the old staging buffer
    staging = DeviceBuffer(n * sizeof(float));
  }
  ALP_CUDA(cudaMemcpy(staging.get(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  lin.w = DeviceBuffer(n);
  lin.scale = DeviceBuffer(size_t(lin.N) * sizeof(float));
  quantize_weight_fp8(nullptr, staging.as<float>(), lin.N, lin.K, lin.w.as<uint8_t>(), lin.scale.as<float>());
  bytes_ += lin.w.bytes() + lin.scale.bytes();
  return lin;
}

}  // namespace alpamayo::ALP_CUDA_NS
