// CpuModel (weight packing) and CpuSession construction and binding.
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <thread>

#include "alpamayo/error.h"
#include "backends/cpu/cpu_backend_impl.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/peaks.h"

namespace alpamayo {

std::unique_ptr<BackendModel> load_cpu_backend(const ExpertConfig& cfg, const ModelWeights& w,
                                               const BackendOptions& opts) {
  return std::make_unique<cpu::CpuModel>(cfg, w, opts);
}

namespace cpu {
namespace {

// The registry has already checked the name against the formats the cpu backend offers; the block formats
// run with bf16 activations.
WeightType parse_weights(const std::string& w) { return w == "int8" ? WeightType::INT8 : WeightType::BF16; }

int resolve_threads(int t) {
  return t > 0 ? t : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Splits N columns over `parts` threads in units of 64 (oneDNN's weight block), some may be empty.
std::vector<Slice> split_cols(int N, int parts) {
  const int unit = 64, units = (N + unit - 1) / unit;
  std::vector<Slice> s(parts);
  for (int t = 0; t < parts; ++t) {
    s[t].n0 = std::min(N, int(int64_t(units) * t / parts) * unit);
    s[t].n1 = std::min(N, int(int64_t(units) * (t + 1) / parts) * unit);
  }
  return s;
}

}  // namespace

void CpuModel::pack_layer(const LayerWeights& lw, CpuLayer& out) {
  const int D = cfg_.D, Hq = cfg_.Hq, Hkv = cfg_.Hkv, d = cfg_.d, I = cfg_.I;
  const int Nqkv = (Hq + 2 * Hkv) * d, Mhint = cfg_.T > 0 ? cfg_.T : 64;
  out.input_norm = to_f32(lw.input_norm);
  out.post_norm = to_f32(lw.post_norm);
  out.q_norm = to_f32(lw.q_norm);
  out.k_norm = to_f32(lw.k_norm);
  out.qkv.resize(nthreads_);
  out.o.resize(nthreads_);
  out.gate_up.resize(nthreads_);
  out.down.resize(nthreads_);

  std::vector<float> qkv(size_t(Nqkv) * D);
  convert_to_f32(lw.q, qkv.data());
  convert_to_f32(lw.k, qkv.data() + size_t(Hq) * d * D);
  convert_to_f32(lw.v, qkv.data() + size_t(Hq + Hkv) * d * D);
  if (wf_.is_block()) {
    pack_layer_blocks(qkv, lw, out);
    return;
  }
  for (int t = 0; t < nthreads_; ++t) {
    const Slice s = qkv_slices_[t];
    if (s.n1 > s.n0) out.qkv[t].pack(*kernels_, wtype_, D, s.n1 - s.n0, qkv.data() + size_t(s.n0) * D, Mhint, s.n1 - s.n0);
  }
  qkv = {};
  const std::vector<float> o = to_f32(lw.o);
  for (int t = 0; t < nthreads_; ++t) {
    const Slice s = o_slices_[t];
    const int n = s.n1 - s.n0;
    if (n > 0) out.o[t].pack(*kernels_, wtype_, Hq * d, n, o.data() + size_t(s.n0) * Hq * d, Mhint, n);
  }
  {
    // Each thread's slice holds gate rows [n0, n1) then up rows [n0, n1): SiLU*up stays thread-local.
    const std::vector<float> gate = to_f32(lw.gate), up = to_f32(lw.up);
    for (int t = 0; t < nthreads_; ++t) {
      const Slice s = mlp_slices_[t];
      const int n = s.n1 - s.n0;
      if (n == 0) continue;
      std::vector<float> gu(size_t(2) * n * D);
      std::copy(gate.begin() + size_t(s.n0) * D, gate.begin() + size_t(s.n1) * D, gu.begin());
      std::copy(up.begin() + size_t(s.n0) * D, up.begin() + size_t(s.n1) * D, gu.begin() + size_t(n) * D);
      out.gate_up[t].pack(*kernels_, wtype_, D, 2 * n, gu.data(), Mhint, 2 * n);
    }
  }
  const std::vector<float> down = to_f32(lw.down);
  for (int t = 0; t < nthreads_; ++t) {
    const Slice s = down_slices_[t];
    const int n = s.n1 - s.n0;
    if (n > 0) out.down[t].pack(*kernels_, wtype_, I, n, down.data() + size_t(s.n0) * I, Mhint, n);
  }
}

// Block formats: each thread's column slices stored as the device holds them (bfp_matmul.h); slices start at
// multiples of 64 columns, so their blocks and tiles are those of the whole matrix (weight_formats.h).
void CpuModel::pack_layer_blocks(const std::vector<float>& qkv, const LayerWeights& lw, CpuLayer& out) {
  const int D = cfg_.D, Hq = cfg_.Hq, d = cfg_.d, I = cfg_.I;
  auto store = [&](LinearKind k) {
    const auto f = wf_.block_of(k);
    return !f ? BlockStore::BF16 : *f == bfp::Format::Bfp8_b ? BlockStore::BFP8_B : BlockStore::BFP4_B;
  };
  out.bqkv.resize(nthreads_);
  out.bo.resize(nthreads_);
  out.bgate_up.resize(nthreads_);
  out.bdown.resize(nthreads_);
  auto pack = [&](std::vector<BlockLinear>& dst, const std::vector<Slice>& slices, LinearKind k, const float* W, int K) {
    for (int t = 0; t < nthreads_; ++t)
      if (const Slice s = slices[t]; s.n1 > s.n0)
        dst[t].parts.emplace_back().pack(store(k), W + size_t(s.n0) * K, K, s.n1 - s.n0);
  };
  pack(out.bqkv, qkv_slices_, LinearKind::QKV, qkv.data(), D);
  pack(out.bo, o_slices_, LinearKind::O, to_f32(lw.o).data(), Hq * d);
  pack(out.bgate_up, mlp_slices_, LinearKind::Gate, to_f32(lw.gate).data(), D);
  pack(out.bgate_up, mlp_slices_, LinearKind::Up, to_f32(lw.up).data(), D);
  pack(out.bdown, down_slices_, LinearKind::Down, to_f32(lw.down).data(), I);
}

CpuModel::CpuModel(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts)
    : opts_((isa(), opts)),  // the ISA cap must reach oneDNN before its first primitive
      wf_(parse_weight_format(opts)),
      wtype_(parse_weights(opts.weights)),
      nthreads_(resolve_threads(opts.threads)),
      cfg_(cfg),
      eng_(dnnl::engine::kind::cpu, 0),
      kernels_(std::make_unique<MatmulKernels>(eng_)),
      proj_(cfg, w, opts.exact_freqs) {
  const int D = cfg.D, Hq = cfg.Hq, Hkv = cfg.Hkv, d = cfg.d, I = cfg.I;
  qkv_slices_ = split_cols((Hq + 2 * Hkv) * d, nthreads_);
  o_slices_ = split_cols(D, nthreads_);
  mlp_slices_ = split_cols(I, nthreads_);
  down_slices_ = o_slices_;
  layers_.assign(cfg.L, {});
  final_norm_ = to_f32(w.expert.final_norm);
  // Attention: timed on the model's shape (one sample's query rows per KV head, a few thousand keys).
  attn_kernel_ = select_attention_kernel(d, Hq / Hkv, cfg.T > 0 ? cfg.T : 64);
  // Packing runs on a temporary pool; each session has its own.
  ThreadPool pool(nthreads_);
  ScopedOmpThreads one(1);  // oneDNN kernels are planned and run single-threaded per pool thread
  pool.run([&](int tid) {
    ScopedOmpThreads one_here(1);
    for (int l = tid; l < cfg.L; l += nthreads_) pack_layer(w.expert.layers[l], layers_[l]);
  });
}

size_t CpuModel::weight_bytes() const {
  size_t n = final_norm_.size() * sizeof(float);
  for (const CpuLayer& layer : layers_) {
    n += (layer.input_norm.size() + layer.post_norm.size() + layer.q_norm.size() + layer.k_norm.size()) * sizeof(float);
    for (const auto* list : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
      for (const PackedLinear& p : *list) n += p.packed_bytes() + (p.col_scale() ? 2 * sizeof(float) * p.N() : 0);
    for (const auto* list : {&layer.bqkv, &layer.bo, &layer.bgate_up, &layer.bdown})
      for (const BlockLinear& b : *list) n += b.bytes();
  }
  return n;
}

std::unique_ptr<BackendSession> CpuModel::new_session() const { return std::make_unique<CpuSession>(*this); }

CpuSession::CpuSession(const CpuModel& m)
    : HostLoopSession(m.cfg_, m.proj_),
      m_(m),
      nthreads_(m.nthreads_),
      attn_kernel_(m.attn_kernel_),
      block_kernel_(default_block_kernel()),
      pool_(nthreads_) {
  for (int t = 0; t < nthreads_; ++t) streams_.emplace_back(m.eng_);
  per_thread_.resize(nthreads_);
}

void CpuSession::bind_step(const Binding& bnd) {
  const KVCache& kv = bnd.kv;
  const RopeTables& rope = bnd.rope;
  const int L = cfg_.L, Hkv = cfg_.Hkv, Hq = cfg_.Hq, d = cfg_.d, D = cfg_.D, I = cfg_.I;
  B_ = kv.B;
  T_ = rope.T;
  P_ = kv.P;
  Q_ = kv.Q;
  M_ = B_ * T_;
  kv_ = kv;
  cos_ = rope.cos;
  sin_ = rope.sin;

  // KV caches: used in place when bf16, otherwise converted once here.
  owned_cache_.clear();
  auto as_bf16 = [&](const TensorView& t) {
    if (t.dtype == DType::BF16) return static_cast<const uint16_t*>(t.data);
    owned_cache_.emplace_back(size_t(t.numel()));
    convert_to_bf16(t, owned_cache_.back().data());
    return static_cast<const uint16_t*>(owned_cache_.back().data());
  };
  k_cache_.assign(L, nullptr);
  v_cache_.assign(L, nullptr);
  ks_cache_.assign(kv.suffix_key.empty() ? 0 : L, nullptr);
  vs_cache_.assign(ks_cache_.size(), nullptr);
  for (int l = 0; l < L; ++l) {
    k_cache_[l] = as_bf16(kv.key[l]);
    v_cache_[l] = as_bf16(kv.value[l]);
    if (!ks_cache_.empty()) {
      ks_cache_[l] = as_bf16(kv.suffix_key[l]);
      vs_cache_[l] = as_bf16(kv.suffix_value[l]);
    }
  }
  members_.assign(kv.G, {});
  member_.assign(B_, 0);
  for (int b = 0; b < B_; ++b) {
    member_[b] = static_cast<int>(members_[kv.prompt(b)].size());
    members_[kv.prompt(b)].push_back(b);
  }

  // Matmul plans for M rows: the model's packed weights are shared, never modified.
  const int Nqkv = (Hq + 2 * Hkv) * d;
  plans_.assign(L, std::vector<LayerPlans>(nthreads_));
  {
    ScopedOmpThreads one(1);
    MatmulKernels& kernels = *m_.kernels_;
    for (int l = 0; l < L; ++l)
      for (int t = 0; t < nthreads_; ++t) {
        const CpuLayer& layer = m_.layers_[l];
        LayerPlans& p = plans_[l][t];
        if (layer.qkv[t].N()) p.qkv = layer.qkv[t].plan(kernels, M_, layer.qkv[t].N());
        if (layer.o[t].N()) p.o = layer.o[t].plan(kernels, M_, layer.o[t].N());
        if (layer.gate_up[t].N()) p.gate_up = layer.gate_up[t].plan(kernels, M_, layer.gate_up[t].N());
        if (layer.down[t].N()) p.down = layer.down[t].plan(kernels, M_, layer.down[t].N());
      }
  }

  const int wide = std::max({D, Hq * d, I});
  const bool i8 = m_.wtype_ == WeightType::INT8;
  h_.resize(size_t(M_) * D);
  qkv_.resize(size_t(M_) * Nqkv);
  x_bf16_.resize(i8 ? 0 : size_t(M_) * D);
  y_bf16_.resize(i8 ? 0 : size_t(M_) * wide);
  x_u8_.resize(i8 ? size_t(M_) * D : 0);
  y_u8_.resize(i8 ? size_t(M_) * wide : 0);
  act_f32_.resize(i8 ? size_t(M_) * wide : 0);
  x_scale_.resize(M_);
  y_scale_.resize(M_);
  geo_ = AttnGeometry::make(d, Hq / Hkv, T_);
  k_own_.resize(size_t(B_) * Hkv * T_ * d);
  v_own_.resize(size_t(B_) * Hkv * T_ * d);
  qp_.resize(size_t(B_) * Hkv * (d / 2) * geo_.Rp);
  qbase_.assign(kv.G, 0);
  for (int p = 1; p < kv.G; ++p) qbase_[p] = qbase_[p - 1] + members_[p - 1].size() * Hkv * (d / 2) * geo_.Rp;
  plan_attention();
  // The profile's floors need the instruction peaks: measured here (once per process), not inside a step.
  if (m_.opts_.profile) measured_peaks(nthreads_);
  size_t slots = 0, max_rows = geo_.Rp;
  for (const AttnItem& it : items_) {
    slots = std::max(slots, size_t(it.slot + it.count));
    max_rows = std::max(max_rows, size_t(it.count) * geo_.Rp);
  }
  part_o_.resize(slots * geo_.Rp * geo_.dp);
  part_m_.resize(slots * geo_.Rp);
  part_l_.resize(slots * geo_.Rp);
  AttnGeometry& widest = attn_widest_;
  widest = geo_;
  widest.R = widest.Rp = widest.qld = static_cast<int>(max_rows);

  for (int t = 0; t < nthreads_; ++t) {
    PerThread& pt = per_thread_[t];
    size_t tmp = 0, scratch = 0;
    for (int l = 0; l < L; ++l) {
      const CpuLayer& layer = m_.layers_[l];
      const LayerPlans& p = plans_[l][t];
      for (const PackedLinear* lin : {&layer.qkv[t], &layer.o[t], &layer.gate_up[t], &layer.down[t]})
        tmp = std::max(tmp, size_t(M_) * lin->N());
      for (const MatmulPlan* mp : {&p.qkv, &p.o, &p.gate_up, &p.down}) scratch = std::max(scratch, mp->scratch_bytes());
      if (m_.wf_.is_block()) {
        for (const BlockLinear* lin : {&layer.bqkv[t], &layer.bo[t], &layer.bgate_up[t], &layer.bdown[t]})
          tmp = std::max(tmp, size_t(M_) * lin->N());
        scratch = std::max(scratch, block_scratch_bytes());
      }
    }
    pt.tmp.resize(tmp);
    pt.scratch.resize(scratch);
    pt.row.resize(std::max({D, I, d}));
    pt.attn.resize(widest, attn_kernel_is_fp32(attn_kernel_));
  }
}

void CpuSession::set_attention_kernel(AttnKernel k) {
  if (const std::string why = attn_kernel_unavailable(k); !why.empty())
    throw Error(std::string("cpu backend: attention kernel ") + attn_kernel_name(k) + " cannot run here: " + why);
  attn_kernel_ = k;
  if (attn_widest_.d > 0)  // already bound: the scratch of the new kernel
    for (PerThread& pt : per_thread_) pt.attn.resize(attn_widest_, attn_kernel_is_fp32(k));
}

uint32_t* CpuSession::qptr(int b, int g) {
  const int p = kv_.prompt(b);
  const size_t n = members_[p].size(), half = cfg_.d / 2;
  return qp_.data() + qbase_[p] + (size_t(g) * n * half + member_[b]) * geo_.Rp;
}

size_t CpuSession::step_buffer_bytes() const {
  size_t n = (h_.size() + qkv_.size() + act_f32_.size() + x_scale_.size() + y_scale_.size() + part_o_.size() +
              part_m_.size() + part_l_.size() + cos_.size() + sin_.size()) * sizeof(float) +
             (x_bf16_.size() + y_bf16_.size() + k_own_.size() + v_own_.size()) * sizeof(uint16_t) +
             (x_u8_.size() + y_u8_.size()) + qp_.size() * sizeof(uint32_t);
  for (const auto& c : owned_cache_) n += c.size() * sizeof(uint16_t);
  for (const PerThread& pt : per_thread_)
    n += (pt.tmp.size() + pt.row.size()) * sizeof(float) + pt.scratch.size() + pt.attn.bytes();
  for (const auto& layer : plans_)
    for (const LayerPlans& p : layer) n += p.qkv.own_bytes() + p.o.own_bytes() + p.gate_up.own_bytes() + p.down.own_bytes();
  return n;
}

void CpuSession::plan_attention() {
  // Chunks of the key sequences so that every thread gets about two items of similar size; one chunk per
  // (b, g) whenever that already balances (the seed: 8 heads over 2 threads), avoiding merges. Samples
  // sharing a prompt attend to its rows in cascade items (the prompt read once for all of them), whose
  // cost counts the number of samples.
  const int Hkv = cfg_.Hkv;
  auto own_rows = [&](int b) {  // keys of b's own sample items
    return (shares_prompt(b) ? 0 : kv_.valid_len[kv_.prompt(b)] - kv_.pad(kv_.prompt(b))) + kv_.suffix(b) + T_;
  };
  int64_t total = 0;
  for (int b = 0; b < B_; ++b) total += int64_t(Hkv) * own_rows(b);
  for (int p = 0; p < kv_.G; ++p)
    if (members_[p].size() > 1)
      total += int64_t(Hkv) * members_[p].size() * (kv_.valid_len[p] - kv_.pad(p));
  const int64_t target = (total + 2 * nthreads_ - 1) / (2 * nthreads_);
  const int64_t chunk = std::max<int64_t>(4 * kKeyBlock, (target + kKeyBlock - 1) / kKeyBlock * kKeyBlock);
  items_.clear();
  merge_slots_.assign(size_t(B_) * Hkv, {});
  single_chunk_ = true;
  int slot = 0;
  for (int p = 0; p < kv_.G; ++p) {
    const int n = static_cast<int>(members_[p].size());
    const int64_t rows = kv_.valid_len[p] - kv_.pad(p);
    if (n < 2 || rows == 0) continue;
    single_chunk_ = false;
    const int parts = static_cast<int>(std::max<int64_t>(1, (rows * n + chunk - 1) / chunk));
    for (int g = 0; g < Hkv; ++g)
      for (int c = 0; c < parts; ++c) {
        items_.push_back({members_[p][0], g, int(rows * c / parts), int(rows * (c + 1) / parts), slot, p, n});
        for (int s = 0; s < n; ++s) merge_slots_[size_t(members_[p][s]) * Hkv + g].push_back(slot + s);
        slot += n;
      }
  }
  for (int b = 0; b < B_; ++b)
    for (int g = 0; g < Hkv; ++g) {
      const int64_t n = own_rows(b);
      const int parts = static_cast<int>((n + chunk - 1) / chunk);
      if (parts > 1) single_chunk_ = false;
      for (int c = 0; c < parts; ++c) {
        items_.push_back({b, g, int(n * c / parts), int(n * (c + 1) / parts), slot});
        merge_slots_[size_t(b) * Hkv + g].push_back(slot++);
      }
    }
}

}  // namespace cpu
}  // namespace alpamayo
