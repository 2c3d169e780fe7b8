// CudaSession: one bound context on one GPU. bind() allocates every buffer the sample uses, binds the cache
// (device memory in place, dense, strided or paged; host memory gathered and uploaded once), scans device-resident cache rows for NaN/Inf and
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
  // a graph holds ~650 nodes per step (twice that with guidance).
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

  // One context's attention inputs: its cache (prompts, suffixes) as bound, its rope tables and its cascade plan.
  // A guided binding has two, run one after the other each step (the guided one first).
  struct Pass {
    std::vector<KVView> k, v, k_suffix, v_suffix;  // per layer, bf16 on the device (suffix: null base without)
    std::vector<DeviceBuffer> owned;                // uploads and conversions (dense [N, Hkv, rows, d])
    DeviceBuffer prompt_pages, suffix_pages;        // the page tables of device caches bound in place
    DeviceBuffer cos, sin, items, members, slot_list, slot_range, part_o, part_m, part_l;
    AttnParams attn;
    size_t bytes() const;
  };

  void release();
  void bind_pass(Pass& ps, const KVCache& kv, const RopeTables& rope);
  KVView bind_tensor(Pass& ps, const KVCache& kv, const TensorView& t, bool suffix, int planes, int rows,
                     const std::vector<int>& lo, const std::vector<int>& hi);
  void upload_rows(const KVCache& kv, const TensorView& t, bool suffix, int planes, int rows,
                   const std::vector<int>& lo, const std::vector<int>& hi, uint16_t* dst);
  void plan_attention(Pass& ps, const KVCache& kv);
  Run& run_for(int steps);
  void enqueue_sample(Run& r, bool capturing);
  void enqueue_step(Run& r, int k);
  void enqueue_layers(const Pass& ps, bool capture, float* hidden);
  void enqueue_layer(const Pass& ps, int l, bool capture, float* hidden);

  const CudaModel& m_;
  const ExpertConfig& cfg_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;

  // The binding.
  bool bound_ = false;
  int B_ = 0, T_ = 0, M_ = 0, Mp_ = 0;
  CaptureRequest req_;
  Captures cap_;
  std::vector<Pass> passes_;  // the context, then the unguided context when guided
  float wu_ = 0.f, wg_ = 1.f;  // guidance weights 1 - w and w (fp32, as the host loop rounds them)
  DeviceBuffer h_, hidden_, hidden_u_, emb_, act_, act_rs_, y_, attn_f32_, q_, k_own_, v_own_, x_;
  DeviceBuffer feat_a_, feat_b_;
  DeviceBuffer cap_emb_, cap_hidden_, cap_layers_;
  DeviceBuffer workspace_;
  Matmul mm_qkv_, mm_o_, mm_gu_, mm_down_;
  std::map<int, std::unique_ptr<Run>> runs_;  // by step count
};

}  // namespace alpamayo::ALP_CUDA_NS
