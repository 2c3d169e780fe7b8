// The work of one sample as enqueued on the session's stream: captured once into a CUDA graph, or launched
// eagerly (bitwise the same). Nothing here allocates or synchronizes.
#include <utility>

#include "alpamayo/error.h"
#include "backends/cuda/cuda_session.h"

namespace alpamayo::ALP_CUDA_NS {

void CudaSession::enqueue_sample(Run& r, bool capturing) {
  const size_t n = size_t(M_) * cfg_.A;
  // Step boundaries for per-step times: inside a capture, external event-record nodes of the graph.
  auto mark = [&](int k) {
    if (r.events.empty()) return;
    if (capturing)
      ALP_CUDA(cudaEventRecordWithFlags(r.events[k], stream_, cudaEventRecordExternal));
    else
      ALP_CUDA(cudaEventRecord(r.events[k], stream_));
  };
  ALP_CUDA(cudaMemcpyAsync(r.x_hist.get(), x_.get(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  for (int k = 0; k < r.steps; ++k) {
    mark(k);
    enqueue_step(r, k);
  }
  mark(r.steps);
}

void CudaSession::enqueue_step(Run& r, int k) {
  const int M = M_, D = cfg_.D, A = cfg_.A, F = cfg_.n_fourier;
  const DeviceActionProj& p = m_.proj();
  const bool capture = k == req_.step;
  const size_t n = size_t(M) * A;

  // action_in_proj: Fourier features, trunk (Linear, SiLU, then RMSNorm(ain_norm_eps), Linear, SiLU ... without SiLU
  // after the last Linear), LayerNorm(ain_norm_eps) into the residual stream h.
  fourier_features(stream_, x_.as<float>(), r.times.as<float>(), k, p.freqs.as<float>(), M, A, F, feat_a_.as<float>());
  float* cur = feat_a_.as<float>();
  float* nxt = feat_b_.as<float>();
  const size_t n_trunk = p.trunk_w.size();
  for (size_t i = 0; i < n_trunk; ++i) {
    if (i > 0) rms_norm_f32(stream_, cur, p.trunk_norm[i - 1].as<float>(), M, p.trunk_in[i], cfg_.ain_norm_eps, cur);
    linear_f32(stream_, cur, M, p.trunk_in[i], p.trunk_w[i].as<float>(), p.trunk_b[i].as<float>(), p.trunk_out[i],
               i + 1 < n_trunk, nxt);
    std::swap(cur, nxt);
  }
  layer_norm_f32(stream_, cur, p.ln_w.as<float>(), p.ln_b.as<float>(), M, D, cfg_.ain_norm_eps, h_.as<float>());
  if (capture)
    ALP_CUDA(
        cudaMemcpyAsync(cap_emb_.get(), h_.get(), size_t(M) * D * sizeof(float), cudaMemcpyDeviceToDevice, stream_));

  // The layers over the context (captured), then with guidance over the unguided context from the same
  // action_in_proj output (the layers update h_ in place, so it is kept in emb_ for the second pass).
  const bool guided = passes_.size() > 1;
  const size_t hd_bytes = size_t(M) * D * sizeof(float);
  if (guided) ALP_CUDA(cudaMemcpyAsync(emb_.get(), h_.get(), hd_bytes, cudaMemcpyDeviceToDevice, stream_));
  enqueue_layers(passes_[0], capture, hidden_.as<float>());
  if (capture) ALP_CUDA(cudaMemcpyAsync(cap_hidden_.get(), hidden_.get(), hd_bytes, cudaMemcpyDeviceToDevice, stream_));
  if (guided) {
    ALP_CUDA(cudaMemcpyAsync(h_.get(), emb_.get(), hd_bytes, cudaMemcpyDeviceToDevice, stream_));
    enqueue_layers(passes_[1], false, hidden_u_.as<float>());
  }

  // action_out_proj (with guidance v = (1 - w) v_u + w v_g) and x_{k+1} = x_k + dt_k v_k.
  out_proj_euler(stream_, hidden_.as<float>(), guided ? hidden_u_.as<float>() : nullptr, wu_, wg_,
                 p.out_w.as<float>(), p.out_b.as<float>(), M, D, A, r.times.as<float>(), k, x_.as<float>(),
                 r.v_hist.as<float>() + k * n, r.x_hist.as<float>() + (k + 1) * n);
}

// One pass of the expert's layers over one context: h_ (action_in_proj's output) in, `hidden` (final-normed) out.
void CudaSession::enqueue_layers(const Pass& ps, bool capture, float* hidden) {
  const Act mode = m_.fp8_activations() ? Act::FP8 : Act::BF16;
  residual_rmsnorm(stream_, h_.as<float>(), MatOut{}, m_.layers()[0].input_norm.as<float>(), M_, cfg_.D,
                   static_cast<float>(cfg_.rms_eps), mode, act_.get(), act_rs_.as<float>());
  for (int l = 0; l < cfg_.L; ++l) enqueue_layer(ps, l, capture, hidden);
}

// One layer: h (fp32 residual stream) and act_ (its input_norm, ready for the qkv matmul) in; h updated and
// act_ holding the next layer's normed input (or `hidden` the final-normed output after the last layer) out.
void CudaSession::enqueue_layer(const Pass& ps, int l, bool capture, float* hidden) {
  const int M = M_, D = cfg_.D, Hq = cfg_.Hq, Hkv = cfg_.Hkv, d = cfg_.d, I = cfg_.I, L = cfg_.L;
  const float eps = static_cast<float>(cfg_.rms_eps);
  const DeviceLayer& w = m_.layers()[l];
  const bool f8a = m_.fp8_activations();
  const Act mode = f8a ? Act::FP8 : Act::BF16;
  const float* rs = f8a ? act_rs_.as<float>() : nullptr;  // row scales of e4m3 matmul inputs (cuBLASLt fp8)
  float* y = y_.as<float>();
  void* ws = workspace_.get();
  const size_t wsb = workspace_.bytes();

  // Attention block.
  const MatOut qkv = mm_qkv_.run(lt_, w.qkv, act_.get(), rs, y, ws, wsb, stream_);
  qk_norm_rope(stream_, qkv, w.q_norm.as<float>(), w.k_norm.as<float>(), ps.cos.as<float>(), ps.sin.as<float>(), B_,
               T_, Hq, Hkv, d, eps, q_.as<uint16_t>(), k_own_.as<uint16_t>(), v_own_.as<uint16_t>());
  AttnParams ap = ps.attn;
  ap.k_cache = ps.k[l];
  ap.v_cache = ps.v[l];
  ap.k_suffix = ps.k_suffix[l];
  ap.v_suffix = ps.v_suffix[l];
  attention_partial(stream_, ap);
  if (f8a) {
    attention_merge(stream_, ap, Act::F32, attn_f32_.get());
    quantize_rows_fp8(stream_, attn_f32_.as<float>(), M, Hq * d, act_.as<uint8_t>(), act_rs_.as<float>());
  } else {
    attention_merge(stream_, ap, Act::BF16, act_.get());
  }
  const MatOut o = mm_o_.run(lt_, w.o, act_.get(), rs, y, ws, wsb, stream_);
  residual_rmsnorm(stream_, h_.as<float>(), o, w.post_norm.as<float>(), M, D, eps, mode, act_.get(),
                   act_rs_.as<float>());

  // MLP block; its residual add carries the next norm (the next layer's input_norm, or the final norm).
  const MatOut gu = mm_gu_.run(lt_, w.gate_up, act_.get(), rs, y, ws, wsb, stream_);
  silu_mul(stream_, gu, M, I, mode, act_.get(), act_rs_.as<float>());
  const MatOut down = mm_down_.run(lt_, w.down, act_.get(), rs, y, ws, wsb, stream_);
  const bool last = l + 1 == L;
  const float* next_norm = last ? m_.final_norm().as<float>() : m_.layers()[l + 1].input_norm.as<float>();
  residual_rmsnorm(stream_, h_.as<float>(), down, next_norm, M, D, eps, last ? Act::F32 : mode,
                   last ? static_cast<void*>(hidden) : act_.get(), act_rs_.as<float>());
  if (capture && cap_layers_)
    ALP_CUDA(cudaMemcpyAsync(cap_layers_.as<float>() + size_t(l) * M * D, h_.get(), size_t(M) * D * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace alpamayo::ALP_CUDA_NS
