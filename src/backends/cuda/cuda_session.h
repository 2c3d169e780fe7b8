// CudaSession: one bound context on one GPU. bind() allocates every buffer the sample uses, binds the cache
// (device memory in place, host memory uploaded once), scans device-resident cache rows for NaN/Inf and
// plans the matmuls and the attention split; the first denoise() with a given step count captures the
// whole sample (all N Euler steps) as one CUDA graph, and every later one replays it.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <vector>

#include "alpamayo/backend.h"
#include "backends/cuda/cuda_model.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"

namespace alpamayo::ALP_CUDA_NS {

class CudaSession final : public BackendSession {
 public:
  explicit CudaSession(const CudaModel& m);
  ~CudaSession() override;
  void bind(const Binding& b) override;
  void denoise(const DenoiseArgs& a) override;
  const Captures& captures() const override { return cap_; }
  size_t buffer_bytes() const override;

  // Samples with more steps than this run as eagerly launched kernels (still without host synchronization):
  // a graph holds ~650 nodes per step.
  static constexpr int kMaxGraphSteps = 64;

 private:
  // What one step count needs beyond the binding: the time grid, x_k / v_k histories, per-step events,
  // staging for the copies, and the captured graph.
  struct Run {
    int steps = 0;
    DeviceBuffer times, x_hist, v_hist;
    PinnedBuffer h_x, h_times, h_x_hist, h_v_hist;
    std::vector<cudaEvent_t> events;  // steps + 1 when timed
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~Run();
  };

  void release();
  void bind_cache(const KVCache& kv);
  void plan_attention();
  Run& run_for(int steps);
  void enqueue_sample(Run& r, bool capturing);
  void enqueue_step(Run& r, int k);
  void enqueue_layer(int l, bool capture);

  const CudaModel& m_;
  const ExpertConfig& cfg_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;

  // The binding.
  bool bound_ = false;
  int B_ = 0, T_ = 0, M_ = 0, Mp_ = 0, P_ = 0;
  std::vector<int> S_;
  CaptureRequest req_;
  Captures cap_;
  std::vector<const uint16_t*> k_cache_, v_cache_;  // per layer, bf16 [B, Hkv, P, d] on the device
  std::vector<DeviceBuffer> owned_cache_;           // uploads and conversions
  DeviceBuffer S_dev_, cos_, sin_;
  DeviceBuffer h_, hidden_, act_, act_rs_, y_, attn_f32_, q_, k_own_, v_own_, x_;
  DeviceBuffer feat_a_, feat_b_;
  DeviceBuffer items_, item_range_, part_o_, part_m_, part_l_;
  DeviceBuffer cap_emb_, cap_hidden_, cap_layers_;
  DeviceBuffer workspace_;
  AttnParams attn_;
  Matmul mm_qkv_, mm_o_, mm_gu_, mm_down_;
  std::map<int, std::unique_ptr<Run>> runs_;  // by step count
};

}  // namespace alpamayo::ALP_CUDA_NS
