// Weight-stationary matmuls on oneDNN: y[M, N] = x[M, K] W[N, K]^T with W packed once into the layout
// the primitive prefers (memory format `any`). bf16 x bf16 -> fp32, or u8 x s8 -> fp32 (integer sums).
// int8 activations are symmetric s8 values stored as u8 = q + 128 (vpdpbusd's native u8 x s8 form); the
// caller's epilogue subtracts col_correction()[n] = 128 * sum_k w_q[n][k] and multiplies by
// col_scale()[n] and the activation row scale. No oneDNN output scales: oneDNN 2.6 drops from brgemm to
// a slower gemm for int8 matmuls with runtime scales (docs/PERFORMANCE.md).
// Each OnednnLinear is one column slice run by one pool thread with single-threaded oneDNN.
#pragma once
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/runtime/huge_buf.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

enum class WeightType { BF16, INT8 };

// Why the cpu backend never runs oneDNN's int8 matmul here ("" where it may): without VNNI (AVX512-VNNI or
// AVX-VNNI, as isa() allows) oneDNN 2.6 multiplies u8 x s8 with vpmaddubsw, whose int16 pair sums saturate
// (gemm:jit, under ALPAMAYO_CPU_ISA=avx2 and on AVX2-only CPUs: errors of 11% of the largest output in
// the op suite's int8 linear on oneDNN, and conformance PCC 0.99 instead of >= 0.999).
std::string onednn_int8_refused(const IsaInfo& i = isa());

// One compiled matmul shape, shared by every slice with the same sizes.
struct OnednnPrimitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
};

// Creates kernels on first use (thread-safe). Must be called with OpenMP limited to one thread
// (ScopedOmpThreads), so that oneDNN plans for the single thread that will run it.
class OnednnPrimitives {
 public:
  explicit OnednnPrimitives(const dnnl::engine& eng) : eng_(eng) {}
  // The kernel oneDNN prefers for these sizes (weights layout `any`).
  std::shared_ptr<const OnednnPrimitive> get(WeightType t, int M, int K, int N, int ldy);
  // A kernel for these sizes reading weights already packed in layout `wei`; null if oneDNN has none.
  std::shared_ptr<const OnednnPrimitive> get_for_layout(WeightType t, int M, int K, int N, int ldy,
                                                     const dnnl::memory::desc& wei);
  const dnnl::engine& engine() const { return eng_; }

 private:
  dnnl::engine eng_;
  std::mutex mu_;
  std::map<std::tuple<int, int, int, int, int, bool>, std::shared_ptr<const OnednnPrimitive>> cache_;
};

// How one session runs one OnednnLinear for its M rows: a kernel for the model's packed layout, or, only
// where oneDNN has none for this M, the session's own repacked copy of the weights.
struct OnednnPlan {
  std::shared_ptr<const OnednnPrimitive> kernel;
  dnnl::memory own_weights;  // empty unless repacked for this session
  size_t scratch_bytes() const { return kernel ? kernel->scratch_bytes : 0; }
  size_t own_bytes() const { return own_weights ? own_weights.get_desc().get_size() : 0; }
};

class OnednnLinear {
 public:
  // Packs W [N, K] (fp32 rows) in the layout oneDNN prefers for M-row inputs and an output leading
  // dimension ldy (any M can run it later, see plan()); int8 quantizes
  // each row symmetrically (scale = max|w| / 127, values in [-127, 127]).
  void pack(OnednnPrimitives& kernels, WeightType t, int K, int N, const float* W, int M, int ldy);
  // A plan for M-row inputs and output leading dimension ldy (at a session's bind). The packed weights
  // are never modified, so sessions with different M share them.
  OnednnPlan plan(OnednnPrimitives& kernels, int M, int ldy) const;
  // y[M, ldy] (first N columns written) = x W^T. x: bf16 or u8 [M, K]; scratch: plan.scratch_bytes().
  void run(dnnl::stream& s, const OnednnPlan& plan, const void* x, float* y, void* scratch) const;
  // The packed weights, for prefetching.
  const char* packed_data() const { return N_ ? static_cast<const char*>(weights_.get_data_handle()) : nullptr; }
  size_t packed_bytes() const { return N_ ? weights_.get_desc().get_size() : 0; }
  // int8: the per-column offset the +128 shift of the activations adds to y, and the weight scales;
  // nullptr for bf16.
  const float* col_correction() const { return corr_.empty() ? nullptr : corr_.data(); }
  const float* col_scale() const { return scale_.empty() ? nullptr : scale_.data(); }
  int N() const { return N_; }
  int K() const { return K_; }

 private:
  WeightType type_ = WeightType::BF16;
  // Memory for packed weights of layout md (sets buf_ for bf16).
  dnnl::memory new_weights(const dnnl::memory::desc& md, const dnnl::engine& eng);

  int K_ = 0, N_ = 0;
  std::shared_ptr<const HugeBuf> buf_;  // weights_' data (huge pages); shared by copies like weights_
  dnnl::memory weights_;
  std::vector<float> corr_, scale_;
};

}  // namespace alpamayo::cpu
