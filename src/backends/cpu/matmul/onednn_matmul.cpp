#include "backends/cpu/matmul/onednn_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dt src_type(WeightType t) { return t == WeightType::INT8 ? dt::u8 : dt::bf16; }
dt wei_type(WeightType t) { return t == WeightType::INT8 ? dt::s8 : dt::bf16; }

}  // namespace

std::string onednn_int8_refused(const IsaInfo& i) {
  if (i.has(kAvx512Vnni) || i.has(kAvxVnni)) return "";
  return "oneDNN's u8 x s8 matmul without VNNI (vpmaddubsw) saturates int16 pair sums (usable here: " +
         i.describe() + ")";
}

std::shared_ptr<const OnednnPrimitive> OnednnPrimitives::get(WeightType t, int M, int K, int N, int ldy) {
  const auto key = std::make_tuple(static_cast<int>(t), M, K, N, ldy, false);
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  try {
    const memory::desc src({M, K}, src_type(t), memory::dims{K, 1});
    const memory::desc wei({K, N}, wei_type(t), tag::any);
    const memory::desc dst({M, N}, dt::f32, memory::dims{ldy, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto k = std::make_shared<OnednnPrimitive>();
    k->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, eng_);
    k->prim = dnnl::matmul(k->pd);
    k->scratch_bytes = k->pd.scratchpad_desc().get_size();
    cache_[key] = k;
    return k;
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::Unsupported, std::string("cpu backend: oneDNN matmul ") + std::to_string(M) + "x" + std::to_string(K) +
                "x" + std::to_string(N) + " unavailable: " + e.what());
  }
}

std::shared_ptr<const OnednnPrimitive> OnednnPrimitives::get_for_layout(WeightType t, int M, int K, int N, int ldy,
                                                                  const memory::desc& wei) {
  // Every slice of one (K, N) is packed in the same layout, so the key need not hold the descriptor.
  const auto key = std::make_tuple(static_cast<int>(t), M, K, N, ldy, true);
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  std::shared_ptr<OnednnPrimitive> k;
  try {
    const memory::desc src({M, K}, src_type(t), memory::dims{K, 1});
    const memory::desc dst({M, N}, dt::f32, memory::dims{ldy, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    k = std::make_shared<OnednnPrimitive>();
    k->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, eng_);
    k->prim = dnnl::matmul(k->pd);
    k->scratch_bytes = k->pd.scratchpad_desc().get_size();
  } catch (const dnnl::error&) {
    k.reset();  // no implementation for this layout and M: the caller repacks
  }
  cache_[key] = k;
  return k;
}

void OnednnLinear::pack(OnednnPrimitives& kernels, WeightType t, int K, int N, const float* W, int M, int ldy) {
  type_ = t;
  K_ = K;
  N_ = N;
  const auto kernel = kernels.get(t, M, K, N, ldy);
  const auto& eng = kernels.engine();
  // W is [N, K] row-major, i.e. the [K, N] matrix oneDNN wants with strides {1, K}.
  const memory::desc user_md({K, N}, wei_type(t), memory::dims{1, K});
  memory user(user_md, eng);
  if (t == WeightType::BF16) {
    auto* p = static_cast<uint16_t*>(user.get_data_handle());
    for (int64_t i = 0; i < int64_t(N) * K; ++i) p[i] = f32_to_bf16(W[i]);
  } else {
    scale_.assign(N, 0.f);
    corr_.assign(N, 0.f);
    std::vector<int32_t> sums(N);
    quantize_weight_rows(W, K, N, static_cast<int8_t*>(user.get_data_handle()), scale_.data(), sums.data());
    for (int n = 0; n < N; ++n) corr_[n] = static_cast<float>(128 * int64_t(sums[n]));
  }
  weights_ = new_weights(kernel->pd.weights_desc(), eng);
  dnnl::stream s(eng);
  dnnl::reorder(user, weights_).execute(s, user, weights_);
  s.wait();
}

OnednnPlan OnednnLinear::plan(OnednnPrimitives& kernels, int M, int ldy) const {
  OnednnPlan p;
  p.kernel = kernels.get(type_, M, K_, N_, ldy);
  if (p.kernel->pd.weights_desc() == weights_.get_desc()) return p;
  if (auto k = kernels.get_for_layout(type_, M, K_, N_, ldy, weights_.get_desc())) {
    p.kernel = k;
    return p;
  }
  p.own_weights = memory(p.kernel->pd.weights_desc(), kernels.engine());
  dnnl::stream s(kernels.engine());
  dnnl::reorder(weights_, p.own_weights).execute(s, const_cast<memory&>(weights_), p.own_weights);
  s.wait();
  return p;
}

// bf16 weights on transparent huge pages: their matmuls ran faster (cold weights, fewer TLB misses). int8
// weights stay on oneDNN's allocation: huge pages measured slower there (docs/PERFORMANCE.md).
memory OnednnLinear::new_weights(const memory::desc& md, const dnnl::engine& eng) {
  if (type_ != WeightType::BF16) {
    buf_.reset();
    return memory(md, eng);
  }
  buf_ = std::make_shared<HugeBuf>(md.get_size());
  return memory(md, eng, buf_->data());
}

void OnednnLinear::run(dnnl::stream& s, const OnednnPlan& plan, const void* x, float* y, void* scratch) const {
  const auto& pd = plan.kernel->pd;
  const dnnl::engine eng = pd.get_engine();
  memory src(pd.src_desc(), eng, const_cast<void*>(x));
  memory dst(pd.dst_desc(), eng, y);
  // The packed weights are only read; oneDNN's memory handle is not const-qualified.
  memory wei = plan.own_weights ? plan.own_weights : weights_;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (plan.kernel->scratch_bytes) args.emplace(DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), eng, scratch));
  plan.kernel->prim.execute(s, args);
}

}  // namespace alpamayo::cpu
