// The cpu backend's state. CpuModel packs the weights into per-thread column slices once; each
// CpuSession owns a thread pool, matmul plans, activations and scratch for its bound context and runs all
// layers of a step inside one pool dispatch, phases separated by barriers (see docs/CPU_BACKEND.md).
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "backends/host_loop.h"
#include "backends/cpu/runtime/aligned.h"
#include "backends/cpu/attention/attention.h"
#include "backends/cpu/matmul/bfp_matmul.h"
#include "backends/cpu/matmul/matmul_kernels.h"
#include "backends/cpu/runtime/huge_buf.h"
#include "backends/cpu/matmul/onednn_matmul.h"
#include "backends/cpu/runtime/thread_pool.h"
#include "backends/weight_formats.h"
#include "backends/cpu/action_proj.h"

namespace alpamayo::cpu {

// A column range [n0, n1) of a linear layer owned by one thread.
struct Slice {
  int n0 = 0, n1 = 0;
};

// A linear layer on our kernels (matmul_kernels.h), run with work stealing: each thread's column slice is packed as
// chunks of whole panels, back to back in one huge-page arena per thread. A thread runs its own chunks from the
// front; one done early takes the others' from their back (CpuSession::run_chunks), so that a thread the OS or
// the hypervisor holds back no longer holds up the whole phase. Every chunk's sums are those of the whole
// matrix (matmul_kernels.h: no split of the columns changes a bit).
struct FmaLinear {
  std::vector<MatmulWeights> chunks;  // in column order, thread 0's first
  std::vector<Slice> cols;         // chunk c's columns of the output (gate_up: [n0, n1) of gate and of up)
  std::vector<int> first;          // thread t owns chunks [first[t], first[t + 1])
  // Thread t's packed bytes, contiguous (what the attention phase prefetches of o_proj).
  const char* thread_data(int t) const;
  size_t thread_bytes(int t) const;
};

struct CpuLayer {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  std::vector<OnednnLinear> qkv, o, gate_up, down;  // one per thread (bf16, int8: oneDNN)
  std::vector<BlockLinear> bqkv, bo, bgate_up, bdown;  // one per thread (block formats: bfp_matmul.h)
  FmaLinear fqkv, fo, fgate_up, fdown;                 // bf16, int8 on our kernels (matmul_kernels.h)
};

// One attention work item for KV head g, writing partial slot `slot` (a [Rp][dp] block, or `count`
// consecutive ones). Sample item (prompt < 0): keys [j0, j1) of sample b's virtual sequence (its prompt rows
// unless the prompt is shared, its suffix rows, its own rows). Cascade item (prompt >= 0): prompt rows
// [j0, j1) for the queries of every sample sharing that prompt, one slot per sample.
struct AttnItem {
  int b, g, j0, j1, slot;
  int prompt = -1, count = 1;
};

enum Phase { kNorm1, kQkv, kRope, kAttn, kOproj, kNorm2, kGateUp, kDown, kPhases };

class CpuSession;

// Packed weights (immutable after construction) and what every session of the model shares.
// The weight matmuls' kernel for bf16 or int8 weights (op "matmul_bf16" / "matmul_int8") within scope.isa: the one
// forced by scope.kernels (forced_kernel(), isa.h), else the fastest runnable candidate on the representative slice
// kRepTokens x kRepModelDim x 1024 (timed once per process and instruction-set cap) of those that pass the accuracy
// check on it (kernel_check.h). k_model: the model's largest K (avx512_vnni's int32 sums must not overflow). Throws
// alpamayo::Error for a forced kernel that cannot run or fails the check.
KernelChoice select_matmul_kernel(WeightType t, OnednnPrimitives& kernels, int k_model, const KernelScope& scope);
// The same on an engine of its own (inspect --kernels).
KernelChoice select_matmul_kernel(WeightType t, int k_model, const KernelScope& scope);
// A model's scope: isa_with_cap(o.isa_cap) and o.kernels, with where each came from.
KernelScope kernel_scope(const BackendOptions& o);

class CpuModel final : public BackendModel {
 public:
  CpuModel(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts);
  std::string name() const override { return "cpu"; }
  std::string weights() const override { return opts_.weights; }
  size_t weight_bytes() const override;
  std::unique_ptr<BackendSession> new_session() const override;
  // The kernel running the bf16 or int8 weights' matmuls ("onednn", "avx512_fma", "avx2_fma", "portable_fma");
  // "" for the block formats.
  const std::string& matmul_kernel() const { return matmul_kernel_; }
  // "attention=K" (or "attention_kv_int8=K"), then "matmul_bf16=K" or "matmul_int8=K" unless the weights are in
  // a block format: what BackendOptions::kernels takes to choose the same again.
  std::string kernels() const override;
  // What this model chose, per op (inspect, --profile, bench_step), and the instruction sets it may use.
  const KernelChoices& kernel_choices() const { return choices_; }
  const IsaInfo& isa() const { return scope_.isa; }

 private:
  friend class CpuSession;
  struct PackScratch {  // a packing thread's fp32 copies of a layer's matrices, reused from layer to layer
    std::vector<float> a, b, c;
  };
  void pack_layer(const LayerWeights& lw, CpuLayer& out, PackScratch& sc);
  void pack_layer_blocks(const float* qkv, const LayerWeights& lw, CpuLayer& out, PackScratch& sc);

  KernelScope scope_;  // first: its cap reaches oneDNN before the model's first primitive
  BackendOptions opts_;
  WeightFormat wf_;  // block formats run on the block kernels, with bf16 activations
  WeightType wtype_;
  int nthreads_;
  ExpertConfig cfg_;
  dnnl::engine eng_;
  std::unique_ptr<OnednnPrimitives> kernels_;  // a thread-safe cache of compiled shapes
  std::vector<CpuLayer> layers_;
  std::vector<float> final_norm_;
  std::vector<Slice> qkv_slices_, o_slices_, mlp_slices_, down_slices_;
  std::string matmul_kernel_;  // see matmul_kernel()
  bool use_fma_ = false;       // bf16 / int8 weights on fma_kernel_ (MatmulWeights) instead of oneDNN (OnednnLinear)
  MatmulKernel fma_kernel_ = MatmulKernel::Portable;
  bool kv_int8_ = false;    // BackendOptions::kv == "int8": sessions hold their caches as int8 (kv_int8.h)
  AttnKernel attn_kernel_;  // chosen at load (select_attention_kernel)
  KernelChoices choices_;   // every choice above, as made
  HostProjections proj_;
};

class CpuSession final : public HostLoopSession {
 public:
  explicit CpuSession(const CpuModel& m);

  // For tests: force an attention kernel (throws alpamayo::Error if it cannot run here), the portable
  // block-format matmul.
  void set_attention_kernel(AttnKernel k);
  AttnKernel attention_kernel() const { return attn_kernel_; }
  void set_portable_block_kernel(bool on) { block_kernel_ = on ? BlockKernel::Portable : default_block_kernel(); }

 protected:
  void bind_step(const Binding& b) override;
  void step(const float* emb, float* hidden, float* const* layers) override;
  size_t step_buffer_bytes() const override;
  std::unique_ptr<HostLoopSession> new_sibling() const override { return std::make_unique<CpuSession>(m_); }
  const StepProfile* step_profile() const override { return m_.opts_.profile ? &profile_ : nullptr; }

 private:
  // The plans of one layer's four matmuls for one thread.
  struct LayerPlans {
    OnednnPlan qkv, o, gate_up, down;
  };
  void plan_attention();
  void run_step(int tid, const float* emb, float* hidden, float* const* layers);
  void layer_phases(int tid, int l);
  void attention_phase(int tid, int l);
  // The pool's barrier; with the profile on, the wait is added to this thread's share of phase p.
  void barrier(int tid, Phase p);
  // This thread's slice of a linear layer, x [M, K] -> pt.tmp [M, slice width]: oneDNN or the block kernels.
  void run_linear(int tid, const OnednnLinear& lin, const OnednnPlan& plan, const BlockLinear& blk, const void* x,
                  int K);
  // Work stealing over an FmaLinear's chunks (our kernels): per linear and thread, the chunks it has not started
  // (queues_). Reset once per layer by thread 0 between barriers.
  enum Lin { kLinQkv, kLinO, kLinGateUp, kLinDown, kLins };
  void reset_chunk_queues();
  // Runs f on x [M, K] chunk by chunk: this thread's own, then the others' from their back; each chunk's
  // output [M, cols] is left in pt.tmp for epi(cols, y, corr, cscale). Where the kernel asks for wider runs
  // (matmul_many_columns), consecutive chunks of one queue are taken together, up to kMaxRunChunks.
  static constexpr int kMaxRunChunks = 16;
  template <class Epi>
  void run_chunks(int tid, Lin kind, const FmaLinear& f, const void* x, int K, Epi&& epi);
  // The last step's profile (profile_) from the phase times, the kernel choices and the measured peaks.
  void record_profile(double step_ms);

  const CpuModel& m_;
  const int nthreads_;
  AttnKernel attn_kernel_;
  BlockKernel block_kernel_;
  ThreadPool pool_;
  std::unique_ptr<StealQueue[]> queues_;  // [kLins][threads]
  std::vector<dnnl::stream> streams_;
  std::vector<std::vector<LayerPlans>> plans_;  // [layer][thread]

  // Bound context.
  int B_ = 0, T_ = 0, P_ = 0, Q_ = 0, M_ = 0;
  KVCache kv_;                                       // lengths and prompt indices (views unused)
  std::vector<const uint16_t*> k_cache_, v_cache_;  // per layer, prompts [G, Hkv, P, d] bf16
  std::vector<const uint16_t*> ks_cache_, vs_cache_;  // per layer, suffixes [B, Hkv, Q, d] bf16 (or empty)
  std::vector<AlignedBuf<uint16_t>> owned_cache_;   // converted F32/F16 caches
  // Per layer, the bf16 views read in place that are not dense row-major (strided views, page pools): their data
  // and strides in elements; data null: the plain pointers above.
  struct CacheMap {
    const uint16_t* data = nullptr;
    int64_t s0 = 0, s1 = 0, s2 = 0;
  };
  std::vector<CacheMap> k_map_, v_map_, ks_map_, vs_map_;
  const uint16_t* cache_as_bf16(const KVCache& kv, const TensorView& t, bool suffix, CacheMap& map);
  // Rows from row0 on of head h of sequence n (prompt, or sample's suffix) of a mapped view, for the kernels.
  RowMap row_map(const CacheMap& c, bool suffix, int n, int h, int64_t row0) const;
  // An int8 cache (kv int8): per layer the attended prompt and suffix rows quantised once at bind (keys stored
  // q + 128, values q) with their per-row scales, packed: the rows of prompt g's head h from row
  // i8_prompt_row0_[g * Hkv + h], those of sample b's suffix from i8_suffix_row0_[b * Hkv + h] (the same for every
  // layer); the own rows [B, Hkv, T, d] quantised in each layer's rope phase.
  struct Int8Rows {
    HugeArray<uint8_t> k;  // fresh pages, first touched by the quantising threads in parallel
    HugeArray<int8_t> v;
    AlignedBuf<float> ks, vs;
    // Room for `rows` rows of d, kept from an earlier bind where it fits: a new context of the same sizes (the
    // next camera frame's) then costs only the quantisation, not 600 MB of fresh pages, which cost far more than
    // the quantisation (docs/PERFORMANCE.md).
    void ensure(size_t rows, int d) {
      if (k.size() < rows * d) {
        k.resize(rows * d);
        v.resize(rows * d);
      }
      if (ks.size() < rows) {
        ks.resize(rows);
        vs.resize(rows);
      }
    }
    size_t bytes() const { return k.size() + v.size() + ks.bytes() + vs.bytes(); }
    // The rows from `row` on, as the attention kernels read them.
    KeyRows::Int8Segment segment(size_t row, int d) const {
      return {k.data() + row * d, v.data() + row * d, ks.data() + row, vs.data() + row};
    }
  };
  std::vector<Int8Rows> i8_prompt_, i8_suffix_;  // per layer
  std::vector<size_t> i8_prompt_row0_, i8_suffix_row0_;
  Int8Rows i8_own_;
  void quantise_cache(const KVCache& kv);
  std::vector<float> cos_, sin_;
  AttnGeometry geo_;
  AttnGeometry attn_widest_;                         // the widest item's geometry (scratch size)
  // Samples grouped by prompt: members_[p] in sample order; member_[b] = b's index in its prompt's list.
  // Queries of prompt p's samples lie side by side (qld = n_p * Rp) so a cascade item reads them at once.
  std::vector<std::vector<int>> members_;
  std::vector<int> member_;
  std::vector<size_t> qbase_;                        // per prompt: offset of its (KV head 0) query block
  bool shares_prompt(int b) const { return members_[kv_.prompt(b)].size() > 1; }
  uint32_t* qptr(int b, int g);
  int qld(int b) const { return static_cast<int>(members_[kv_.prompt(b)].size()) * geo_.Rp; }
  std::vector<AttnItem> items_;
  std::vector<std::vector<int>> merge_slots_;        // per (b, g): the partial slots to merge
  bool single_chunk_ = true;
  int64_t items_work_ = 0;  // sum of the items' (j1 - j0) * count: shares the o_proj prefetch out
  std::atomic<int> next_item_{0};

  // Activations (sized at bind).
  AlignedBuf<float> h_, qkv_, act_f32_, x_scale_, y_scale_;
  AlignedBuf<uint16_t> x_bf16_, y_bf16_, k_own_, v_own_;
  AlignedBuf<uint8_t> x_u8_, y_u8_;  // int8 activations, stored q + 128
  AlignedBuf<uint32_t> qp_;
  AlignedBuf<float> part_o_, part_m_, part_l_;
  struct PerThread {
    AlignedBuf<float> tmp, row;
    AlignedBuf<uint8_t> scratch;
    AttnScratch attn;
    // Profile: seconds this thread spent in each phase, and of those waited at its barriers (uneven work, or
    // a thread the OS or the hypervisor held back), since its last barrier at `left`.
    double busy_s[kPhases] = {}, wait_s[kPhases] = {};
    std::chrono::steady_clock::time_point left;
  };
  std::vector<PerThread> per_thread_;

  // Profile: seconds per phase summed over the layers of the last step.
  using Clock = std::chrono::steady_clock;
  double phase_s_[kPhases] = {};
  Clock::time_point mark_;
  StepProfile profile_;
};

}  // namespace alpamayo::cpu
