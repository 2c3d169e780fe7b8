// CudaModel: every weight of a sample uploaded once to one GPU (docs/CUDA_BACKEND.md). Immutable after
// construction; its sessions (cuda_session.h) read it concurrently.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/gemm.h"

namespace alpamayo::ALP_CUDA_NS {

// One weight matrix [N, K] (PyTorch [out, in]) on the device: bf16, or e4m3 with per-output-channel
// scales (w ~= q[n][k] * scale[n]).
struct DeviceLinear {
  DeviceBuffer w;
  DeviceBuffer scale;  // fp8: [N] fp32; empty for bf16
  int N = 0, K = 0;
  const float* col_scale() const { return scale ? scale.as<float>() : nullptr; }
};

struct DeviceLayer {
  DeviceBuffer input_norm, post_norm, q_norm, k_norm;  // fp32
  DeviceLinear qkv;                                    // [Wq; Wk; Wv]: [(Hq + 2 Hkv) d, D]
  DeviceLinear o;                                      // [D, Hq d]
  DeviceLinear gate_up;                                // [Wgate; Wup]: [2 I, D]
  DeviceLinear down;                                   // [D, I]
};

// action_in_proj and action_out_proj in fp32 (they are small; the host projections are fp32 too).
struct DeviceActionProj {
  DeviceBuffer freqs;  // [(A+1), F/2]
  std::vector<DeviceBuffer> trunk_w, trunk_b, trunk_norm;
  std::vector<int> trunk_in, trunk_out;
  DeviceBuffer ln_w, ln_b;
  DeviceBuffer out_w, out_b;  // [A, D], [A]
};

// Why this backend cannot run here (empty: it can: a CUDA device of sm_80 or newer), and its loader; the
// registry's entry (backend_info(), cuda_backend.h) names them.
std::string unavailable();
// "" when the current GPU runs weight format `format`, else why (fp8 below sm_89), naming the GPU.
std::string format_unavailable(const std::string& format);
std::unique_ptr<BackendModel> load_backend(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts);

class CudaModel final : public BackendModel {
 public:
  CudaModel(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts);
  std::string name() const override { return "cuda"; }
  std::string weights() const override { return fp8_ ? "fp8" : "bf16"; }
  // Host memory (uploaded once per bind) and this model's own GPU (bound without a copy).
  bool can_read(const Device& dev) const override;
  std::unique_ptr<BackendSession> new_session() const override;
  size_t weight_bytes() const override { return bytes_; }
  // The weight matmuls: "gemm=cublaslt" or "gemm=own" (BackendOptions::kernels pins it).
  std::string kernels() const override;

  const ExpertConfig& config() const { return cfg_; }
  bool fp8() const { return fp8_; }
  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  int attention_ctas_per_sm() const { return attn_ctas_per_sm_; }
  bool use_graphs() const { return use_graphs_; }
  GemmImpl gemm() const { return gemm_; }
  // The matmul inputs are e4m3 with row scales (cuBLASLt's fp8 path), else bf16.
  bool fp8_activations() const { return fp8_ && gemm_ == GemmImpl::Lt; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const DeviceBuffer& final_norm() const { return final_norm_; }
  const DeviceActionProj& proj() const { return proj_; }

 private:
  DeviceLinear upload_linear(const std::vector<const TensorView*>& parts, DeviceBuffer& staging);
  DeviceBuffer upload_f32(const std::vector<float>& v);
  DeviceBuffer upload_f32(const TensorView& t);

  ExpertConfig cfg_;
  bool fp8_ = false;
  bool use_graphs_ = true;
  GemmImpl gemm_ = GemmImpl::Lt;
  int device_ = 0, sm_count_ = 1, attn_ctas_per_sm_ = 1;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer final_norm_;
  DeviceActionProj proj_;
  size_t bytes_ = 0;
};

}  // namespace alpamayo::ALP_CUDA_NS
