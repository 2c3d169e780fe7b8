// The reference backend: docs/MATH.md section 4 in plain fp32, the oracle for every other backend.
// Deliberately unoptimized beyond splitting matmuls and attention heads over threads.
#include "backends/reference/reference_backend.h"

#include <algorithm>
#include <thread>

#include "alpamayo/error.h"
#include "backends/reference/ops.h"
#include "backends/reference/ref_action_proj.h"
#include "backends/weight_formats.h"

namespace alpamayo {
namespace {

// fp32 copy of one layer, made when the layer runs: the oracle reads the checkpoint's own values and
// never holds more than one layer in fp32 (the full-size model is 9.6 GB in fp32). Under a block weight format
// (bfp8_b, bfp4_b) the matrices hold the values the device multiplies with (weight_formats.h): the exact oracle
// of a backend that stores them in that format.
struct RefLayer {
  std::vector<float> input_norm, post_norm, qkv, o, q_norm, k_norm, gate, up, down;
  const float *q, *k, *v;  // rows of qkv
  RefLayer(const LayerWeights& w, const WeightFormat& wf)
      : input_norm(to_f32(w.input_norm)), post_norm(to_f32(w.post_norm)), o(to_f32(w.o)), q_norm(to_f32(w.q_norm)),
        k_norm(to_f32(w.k_norm)), gate(to_f32(w.gate)), up(to_f32(w.up)), down(to_f32(w.down)) {
    const int64_t D = w.q.shape[1], nq = w.q.shape[0], nk = w.k.shape[0], nv = w.v.shape[0];
    qkv.resize((nq + nk + nv) * D);
    convert_to_f32(w.q, qkv.data());
    convert_to_f32(w.k, qkv.data() + nq * D);
    convert_to_f32(w.v, qkv.data() + (nq + nk) * D);
    q = qkv.data();
    k = q + nq * D;
    v = k + nk * D;
    apply_weight_format(wf, LinearKind::QKV, qkv.data(), nq + nk + nv, D);
    apply_weight_format(wf, LinearKind::O, o.data(), w.o.shape[0], w.o.shape[1]);
    apply_weight_format(wf, LinearKind::Gate, gate.data(), w.gate.shape[0], w.gate.shape[1]);
    apply_weight_format(wf, LinearKind::Up, up.data(), w.up.shape[0], w.up.shape[1]);
    apply_weight_format(wf, LinearKind::Down, down.data(), w.down.shape[0], w.down.shape[1]);
  }
};

class ReferenceModel;

class ReferenceSession final : public HostLoopSession {
 public:
  ReferenceSession(const ExpertConfig& cfg, const ActionProjections& proj, const ExpertWeights& w,
                   const WeightFormat& wf, int threads, bool kv_int8)
      : HostLoopSession(cfg, proj), proj_(proj), weights_(w), wf_(wf), threads_(threads), kv_int8_(kv_int8) {}

 protected:
  void bind_step(const Binding& b) override {
    kv_ = b.kv;
    rope_ = b.rope;
  }

  size_t step_buffer_bytes() const override { return (rope_.cos.size() + rope_.sin.size()) * sizeof(float); }
  std::unique_ptr<HostLoopSession> new_sibling() const override {
    return std::make_unique<ReferenceSession>(cfg_, proj_, weights_, wf_, threads_, kv_int8_);
  }

  void step(const float* emb, float* hidden, float* const* layers) override {
    const int M = kv_.B * rope_.T, D = cfg_.D;
    std::vector<float> h(emb, emb + int64_t(M) * D);
    for (int l = 0; l < cfg_.L; ++l) {
      reference_layer(cfg_, weights_.layers[l], wf_, kv_, l, rope_, threads_, h.data(), {}, kv_int8_);
      if (layers) std::copy(h.begin(), h.end(), layers[l]);
    }
    ref::rms_norm(h.data(), to_f32(weights_.final_norm).data(), M, D, cfg_.rms_eps, hidden);
  }

 private:
  const ActionProjections& proj_;
  const ExpertWeights& weights_;  // views into the checkpoint, which the Model keeps alive
  const WeightFormat& wf_;
  int threads_;
  bool kv_int8_;  // the int8 KV cache (reference_layer)
  KVCache kv_;
  RopeTables rope_;
};

// Holds only the views: the oracle converts one layer at a time when it runs (see RefLayer).
class ReferenceModel final : public BackendModel {
 public:
  ReferenceModel(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts)
      : cfg_(cfg),
        weights_(w.expert),
        wf_(parse_weight_format(opts)),
        proj_(cfg, w, opts.exact_freqs),
        threads_(opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency())),
        kv_int8_(opts.kv == "int8") {}  // Model::load checked the format against reference_backend_info()
  std::string name() const override { return "reference"; }
  std::string weights() const override { return wf_.name; }
  size_t weight_bytes() const override { return 0; }
  std::unique_ptr<BackendSession> new_session() const override {
    return std::make_unique<ReferenceSession>(cfg_, proj_, weights_, wf_, threads_, kv_int8_);
  }

 private:
  ExpertConfig cfg_;
  ExpertWeights weights_;
  WeightFormat wf_;
  ref::Projections proj_;
  int threads_;
  bool kv_int8_;
};

// A cache view as dense fp32 [N, Hkv, rows, d]: a contiguous dense view converted whole; a strided view or a page
// pool row by row through kv_row_offset, the rows some sample attends to (the rest stay zero and are never read).
std::vector<float> dense_f32(const KVCache& kv, const TensorView& t, bool suffix) {
  if (!kv.paged() && t.is_contiguous()) return to_f32(t);
  const int N = suffix ? kv.B : kv.G, R = suffix ? kv.Q : kv.P, d = kv.d;
  std::vector<float> out(size_t(N) * kv.Hkv * R * d, 0.f);
  for (int n = 0; n < N; ++n) {
    const int64_t lo = suffix ? 0 : kv.pad(n), hi = suffix ? kv.suffix(n) : kv.valid_len[n];
    for (int h = 0; h < kv.Hkv; ++h)
      for (int64_t i = lo; i < hi; ++i)
        convert_to_f32(kv_row_view(kv, t, suffix, n, h, i), out.data() + ((size_t(n) * kv.Hkv + h) * R + i) * d);
  }
  return out;
}

}  // namespace

// One function on purpose (about 90 lines): the oracle is written to be read, and the layer reads top to bottom as
// docs/MATH.md writes it, each stage followed by its probe.
void reference_layer(const ExpertConfig& cfg, const LayerWeights& lw, const WeightFormat& wf, const KVCache& kv,
                     int layer, const RopeTables& rope, int threads, float* h, const LayerProbe& probe,
                     bool kv_int8) {
  const int B = kv.B, T = rope.T, D = cfg.D, Hq = cfg.Hq, Hkv = cfg.Hkv, d = cfg.d, I = cfg.I, P = kv.P;
  const int M = B * T;
  std::vector<float> a(int64_t(M) * D), q(int64_t(M) * Hq * d), k(int64_t(M) * Hkv * d), v(int64_t(M) * Hkv * d),
      att(int64_t(M) * Hq * d), tmp(int64_t(M) * D), g(int64_t(M) * I), u(int64_t(M) * I);
  const RefLayer w(lw, wf);
  std::vector<float> key = dense_f32(kv, kv.key[layer], false), value = dense_f32(kv, kv.value[layer], false);
  std::vector<float> skey, svalue;
  if (!kv.suffix_key.empty()) {
    skey = dense_f32(kv, kv.suffix_key[layer], true);
    svalue = dense_f32(kv, kv.suffix_value[layer], true);
  }
  if (kv_int8) {
    // The int8 KV cache: every cache row some sample attends to, rows of d per (prompt g, head, position)
    // and per (sample b, head, suffix position), becomes x^ = q * s. Rows no sample reads (padding, garbage)
    // are left alone.
    std::vector<bool> used(kv.G, false);
    for (int b = 0; b < B; ++b) used[kv.prompt(b)] = true;
    for (int g = 0; g < kv.G; ++g)
      if (used[g])
        for (int hd = 0; hd < Hkv; ++hd) {
          const int64_t off = ((int64_t(g) * Hkv + hd) * P + kv.pad(g)) * d, rows = kv.valid_len[g] - kv.pad(g);
          ref::round_rows_s8(key.data() + off, rows, d);
          ref::round_rows_s8(value.data() + off, rows, d);
        }
    for (int b = 0; b < B; ++b)
      if (kv.suffix(b) > 0)
        for (int hd = 0; hd < Hkv; ++hd) {
          const int64_t off = (int64_t(b) * Hkv + hd) * kv.Q * d;
          ref::round_rows_s8(skey.data() + off, kv.suffix(b), d);
          ref::round_rows_s8(svalue.data() + off, kv.suffix(b), d);
        }
  }
  ref::rms_norm(h, w.input_norm.data(), M, D, cfg.rms_eps, a.data());
  if (probe && !probe("input_layernorm", a.data(), int64_t(M) * D)) return;
  ref::matmul_nt(a.data(), M, D, w.q, Hq * d, q.data(), threads);
  ref::matmul_nt(a.data(), M, D, w.k, Hkv * d, k.data(), threads);
  ref::matmul_nt(a.data(), M, D, w.v, Hkv * d, v.data(), threads);
  if (probe && (!probe("self_attn.q_proj", q.data(), int64_t(M) * Hq * d) ||
                !probe("self_attn.k_proj", k.data(), int64_t(M) * Hkv * d) ||
                !probe("self_attn.v_proj", v.data(), int64_t(M) * Hkv * d)))
    return;
  ref::rms_norm(q.data(), w.q_norm.data(), M * Hq, d, cfg.rms_eps, q.data());
  ref::rms_norm(k.data(), w.k_norm.data(), M * Hkv, d, cfg.rms_eps, k.data());
  if (probe && (!probe("self_attn.q_norm", q.data(), int64_t(M) * Hq * d) ||
                !probe("self_attn.k_norm", k.data(), int64_t(M) * Hkv * d)))
    return;
  for (int b = 0; b < B; ++b) {
    const float* c = rope.cos.data() + int64_t(b) * T * d;
    const float* s = rope.sin.data() + int64_t(b) * T * d;
    ref::rope_apply(q.data() + int64_t(b) * T * Hq * d, T, Hq, d, c, s);
    ref::rope_apply(k.data() + int64_t(b) * T * Hkv * d, T, Hkv, d, c, s);
    if (kv_int8) {  // the sample's own T x Hkv key rows (after norm and rope) and value rows
      ref::round_rows_s8(k.data() + int64_t(b) * T * Hkv * d, int64_t(T) * Hkv, d);
      ref::round_rows_s8(v.data() + int64_t(b) * T * Hkv * d, int64_t(T) * Hkv, d);
    }
    // Prompt rows after its left padding, then this sample's suffix rows (docs/MATH.md section 2).
    const int g = kv.prompt(b);
    const int64_t pad = kv.pad(g), poff = (int64_t(g) * Hkv * P + pad) * d;
    std::vector<ref::KeySegment> segs = {
        {key.data() + poff, value.data() + poff, int64_t(P) * d, static_cast<int>(kv.valid_len[g] - pad)}};
    if (kv.suffix(b) > 0) {
      const int64_t soff = int64_t(b) * Hkv * kv.Q * d;
      segs.push_back({skey.data() + soff, svalue.data() + soff, int64_t(kv.Q) * d, static_cast<int>(kv.suffix(b))});
    }
    ref::attention(q.data() + int64_t(b) * T * Hq * d, k.data() + int64_t(b) * T * Hkv * d,
                   v.data() + int64_t(b) * T * Hkv * d, segs, T, Hq, Hkv, d, att.data() + int64_t(b) * T * Hq * d,
                   threads);
  }
  if (probe && !probe("attention (softmax(q k^T) v over the cache and the action tokens)", att.data(), int64_t(M) * Hq * d))
    return;
  ref::matmul_nt(att.data(), M, Hq * d, w.o.data(), D, tmp.data(), threads);
  if (probe && !probe("self_attn.o_proj", tmp.data(), int64_t(M) * D)) return;
  for (int64_t i = 0; i < int64_t(M) * D; ++i) h[i] += tmp[i];
  if (probe && !probe("output after attention (the residual sum)", h, int64_t(M) * D)) return;
  ref::rms_norm(h, w.post_norm.data(), M, D, cfg.rms_eps, a.data());
  if (probe && !probe("post_attention_layernorm", a.data(), int64_t(M) * D)) return;
  ref::matmul_nt(a.data(), M, D, w.gate.data(), I, g.data(), threads);
  ref::matmul_nt(a.data(), M, D, w.up.data(), I, u.data(), threads);
  if (probe && (!probe("mlp.gate_proj", g.data(), int64_t(M) * I) || !probe("mlp.up_proj", u.data(), int64_t(M) * I)))
    return;
  for (int64_t i = 0; i < int64_t(M) * I; ++i) g[i] = ref::silu(g[i]) * u[i];
  if (probe && !probe("silu(gate) * up", g.data(), int64_t(M) * I)) return;
  ref::matmul_nt(g.data(), M, I, w.down.data(), D, tmp.data(), threads);
  if (probe && !probe("mlp.down_proj", tmp.data(), int64_t(M) * D)) return;
  for (int64_t i = 0; i < int64_t(M) * D; ++i) h[i] += tmp[i];
  if (probe) probe("output after the MLP (the residual sum)", h, int64_t(M) * D);
}

std::unique_ptr<BackendModel> load_reference_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                                     const BackendOptions& opts) {
  return std::make_unique<ReferenceModel>(cfg, w, opts);
}

}  // namespace alpamayo
