// CpuSession::step: all layers inside one pool dispatch. Each phase splits its work over the threads
// (matmuls by the column slices packed at load, row-wise ops by rows, attention by work items) and
// ends in a barrier; thread 0 timestamps the barriers for the profile table.
#include <algorithm>
#include <iterator>

#include "alpamayo/error.h"
#include "backends/cpu/cpu_backend_impl.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/profile/peaks.h"

namespace alpamayo::cpu {
namespace {
const BlockLinear kNoBlocks;  // the block argument of run_linear() for the oneDNN formats
}  // namespace

void CpuSession::reset_chunk_queues() {
  if (!m_.use_fma_ || m_.layers_.empty()) return;
  const CpuLayer& l0 = m_.layers_[0];  // every layer has the same chunks
  const FmaLinear* lins[kLins] = {&l0.fqkv, &l0.fo, &l0.fgate_up, &l0.fdown};
  for (int k = 0; k < kLins; ++k)
    for (int t = 0; t < nthreads_; ++t)
      queues_[k * nthreads_ + t].reset(lins[k]->first[t], lins[k]->first[t + 1]);
}

template <class Epi>
void CpuSession::run_chunks(int tid, Lin kind, const FmaLinear& f, const void* x, int K, Epi&& epi) {
  PerThread& pt = per_thread_[tid];
  bool x_ready = false;  // the first chunk this thread runs prepares x in its scratch, the others reuse it
  StealQueue* q = queues_.get() + size_t(kind) * nthreads_;
  // Where the kernel gains from wider runs (amx_bf16 at many rows), whole chunks of one queue are taken until
  // they reach `wide` columns and run as one call, each into its own part of pt.tmp; every chunk's columns and
  // sums stay what they are alone (run_matmul_many), whoever runs it.
  const int wide = f.chunks.empty() ? 0 : matmul_many_columns(f.chunks.front().kernel(), M_);
  MatmulOut outs[kMaxRunChunks];
  int taken[kMaxRunChunks];
  auto run_from = [&](StealQueue& sq, bool back) {
    for (;;) {
      int n = 0, cols = 0;
      float* y = pt.tmp.data();
      for (int c; n < kMaxRunChunks && (n == 0 || cols < wide) && (c = back ? sq.take_back() : sq.take_front()) >= 0;) {
        const MatmulWeights& w = f.chunks[c];
        outs[n] = {&w, y, w.N()};
        taken[n++] = c;
        y += size_t(M_) * w.N();
        cols += w.N();
      }
      if (n == 0) return;
      run_matmul_many(outs, n, x, M_, K, pt.scratch.data(), x_ready);
      x_ready = true;
      for (int i = 0; i < n; ++i) {
        const MatmulWeights& w = f.chunks[taken[i]];
        epi(f.cols[taken[i]], outs[i].y, w.col_correction(), w.col_scale());
      }
    }
  };
  run_from(q[tid], false);
  for (int i = 1; i < nthreads_; ++i) run_from(q[(tid + i) % nthreads_], true);
}

void CpuSession::step(const float* emb, float* hidden, float* const* layers) {
  ScopedOmpThreads one(1);
  std::fill(std::begin(phase_s_), std::end(phase_s_), 0.0);
  for (PerThread& pt : per_thread_) {
    std::fill(std::begin(pt.busy_s), std::end(pt.busy_s), 0.0);
    std::fill(std::begin(pt.wait_s), std::end(pt.wait_s), 0.0);
  }
  const auto t0 = Clock::now();
  reset_chunk_queues();
  pool_.run([&](int tid) { run_step(tid, emb, hidden, layers); });
  if (m_.opts_.profile) record_profile(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

void CpuSession::run_step(int tid, const float* emb, float* hidden, float* const* layers) {
  const int D = cfg_.D;
  const int r0 = M_ * tid / nthreads_, r1 = M_ * (tid + 1) / nthreads_;
  std::copy(emb + int64_t(r0) * D, emb + int64_t(r1) * D, h_.data() + int64_t(r0) * D);
  pool_.barrier();
  if (m_.opts_.profile) per_thread_[tid].left = Clock::now();
  if (tid == 0) mark_ = Clock::now();
  for (int l = 0; l < cfg_.L; ++l) {
    layer_phases(tid, l);
    // Other threads may already read h_ for the next layer's norm; nobody writes it before a barrier.
    if (tid == 0 && layers) {
      std::copy(h_.data(), h_.data() + size_t(M_) * D, layers[l]);
      mark_ = Clock::now();
    }
  }
  rms_norm_rows_f32(h_.data(), m_.final_norm_.data(), r0, r1, D, static_cast<float>(cfg_.rms_eps), hidden);
  pool_.barrier();
}

// One function on purpose (about 100 lines): the layer's phases in dataflow order, each ended by the pool's barrier;
// every thread runs this same sequence, and keeping the barriers in one body makes their pairing visible.
void CpuSession::layer_phases(int tid, int l) {
  const CpuLayer& w = m_.layers_[l];
  const LayerPlans& plan = plans_[l][tid];
  const int D = cfg_.D, Hq = cfg_.Hq, Hkv = cfg_.Hkv, d = cfg_.d, I = cfg_.I, M = M_;
  const int Nqkv = (Hq + 2 * Hkv) * d;
  const float eps = static_cast<float>(cfg_.rms_eps);
  const bool i8 = m_.wtype_ == WeightType::INT8, block = m_.wf_.is_block();
  const int r0 = M * tid / nthreads_, r1 = M * (tid + 1) / nthreads_;
  PerThread& pt = per_thread_[tid];
  const void* x_in = i8 ? static_cast<const void*>(x_u8_.data()) : x_bf16_.data();
  const void* y_in = i8 ? static_cast<const void*>(y_u8_.data()) : y_bf16_.data();
  auto sync = [&](Phase p) {
    barrier(tid, p);
    if (tid == 0) {
      const auto now = Clock::now();
      phase_s_[p] += std::chrono::duration<double>(now - mark_).count();
      mark_ = now;
    }
  };

  // A linear layer on x [M, K]: on our kernels as chunks taken from the queues (run_chunks), else this thread's
  // slice s on oneDNN or the block kernels. epi(cols, y, corr, cscale) takes each part's output, [M, cols] at y
  // (in pt.tmp), with its int8 column correction and weight scales (nullptr for bf16).
  auto linear = [&](Lin kind, const FmaLinear& f, const OnednnLinear& lin, const OnednnPlan& mp,
                    const std::vector<BlockLinear>& blk, Slice s, const void* x, int K, auto&& epi) {
    if (m_.use_fma_) return run_chunks(tid, kind, f, x, K, epi);
    if (s.n1 <= s.n0) return;
    run_linear(tid, lin, mp, block ? blk[tid] : kNoBlocks, x, K);
    epi(s, pt.tmp.data(), lin.col_correction(), lin.col_scale());
  };

  rms_norm_rows(h_.data(), w.input_norm.data(), r0, r1, D, eps, pt.row.data(), i8 ? nullptr : x_bf16_.data(),
                i8 ? x_u8_.data() : nullptr, x_scale_.data());
  sync(kNorm1);

  // Into a private buffer (oneDNN runs slower with a strided destination here: docs/PERFORMANCE.md), then copied.
  linear(kLinQkv, w.fqkv, w.qkv[tid], plan.qkv, w.bqkv, m_.qkv_slices_[tid], x_in, D,
         [&](Slice c, const float* y, const float* corr, const float* cs) {
           copy_rows(qkv_.data() + c.n0, Nqkv, y, M, c.n1 - c.n0, i8 ? x_scale_.data() : nullptr, corr, cs);
         });
  if (tid == 0) next_item_.store(0, std::memory_order_relaxed);
  sync(kQkv);
  // Nobody takes chunks again before the o_proj phase, two barriers on.
  if (tid == 0) reset_chunk_queues();

  {
    // Per (token, head): q/k RMSNorm + rotary, written in the layouts attention reads.
    const int heads = Hq + 2 * Hkv, group = Hq / Hkv, half = d / 2;
    const int64_t units = int64_t(M) * heads;
    const int64_t u0 = units * tid / nthreads_, u1 = units * (tid + 1) / nthreads_;
    for (int64_t u = u0; u < u1; ++u) {
      const int m = static_cast<int>(u / heads), hd = static_cast<int>(u % heads);
      const int b = m / T_, t = m % T_;
      float* x = qkv_.data() + int64_t(m) * Nqkv + int64_t(hd) * d;
      const float* c = cos_.data() + int64_t(m) * d;
      const float* sn = sin_.data() + int64_t(m) * d;
      if (hd < Hq) {
        head_norm_rope(x, d, w.q_norm.data(), eps, c, sn, pt.row.data());
        const int g = hd / group, r = (hd % group) * T_ + t;
        store_bf16_pairs(x, half, qptr(b, g) + r, qld(b));
      } else {
        const bool is_k = hd < Hq + Hkv;
        const int g = is_k ? hd - Hq : hd - Hq - Hkv;
        if (is_k) head_norm_rope(x, d, w.k_norm.data(), eps, c, sn, pt.row.data());
        const int64_t row = int64_t(b * Hkv + g) * T_ + t;
        if (m_.kv_int8_) {
          if (is_k) i8_own_.ks[row] = store_int8_key_row(x, d, i8_own_.k.data() + row * d);
          else i8_own_.vs[row] = store_int8_value_row(x, d, i8_own_.v.data() + row * d);
        } else {
          store_bf16(x, d, (is_k ? k_own_.data() : v_own_.data()) + row * d);
        }
      }
    }
  }
  sync(kRope);

  attention_phase(tid, l);
  sync(kAttn);

  // A projection of y_in, added to the residual stream.
  auto add_residual = [&](Slice c, const float* y, const float* corr, const float* cs) {
    add_rows(h_.data() + c.n0, D, y, c.n1 - c.n0, M, c.n1 - c.n0, i8 ? y_scale_.data() : nullptr, corr, cs);
  };
  linear(kLinO, w.fo, w.o[tid], plan.o, w.bo, m_.o_slices_[tid], y_in, Hq * d, add_residual);
  sync(kOproj);

  rms_norm_rows(h_.data(), w.post_norm.data(), r0, r1, D, eps, pt.row.data(), i8 ? nullptr : x_bf16_.data(),
                i8 ? x_u8_.data() : nullptr, x_scale_.data());
  sync(kNorm2);

  linear(kLinGateUp, w.fgate_up, w.gate_up[tid], plan.gate_up, w.bgate_up, m_.mlp_slices_[tid], x_in, D,
         [&](Slice c, const float* y, const float* corr, const float* cs) {
           silu_mul_rows(y, M, c.n1 - c.n0, i8 ? x_scale_.data() : nullptr, corr, cs, I,
                         i8 ? nullptr : y_bf16_.data() + c.n0, i8 ? act_f32_.data() + c.n0 : nullptr);
         });
  if (i8) {
    barrier(tid, kGateUp);
    quantize_rows(act_f32_.data(), r0, r1, I, y_u8_.data(), y_scale_.data());
  }
  sync(kGateUp);

  linear(kLinDown, w.fdown, w.down[tid], plan.down, w.bdown, m_.down_slices_[tid], y_in, I, add_residual);
  sync(kDown);
}

void CpuSession::barrier(int tid, Phase p) {
  if (!m_.opts_.profile) return pool_.barrier();
  PerThread& pt = per_thread_[tid];
  const auto arrive = Clock::now();
  pool_.barrier();
  const auto now = Clock::now();
  pt.wait_s[p] += std::chrono::duration<double>(now - arrive).count();
  pt.busy_s[p] += std::chrono::duration<double>(now - pt.left).count();
  pt.left = now;
}

void CpuSession::run_linear(int tid, const OnednnLinear& lin, const OnednnPlan& plan, const BlockLinear& blk,
                            const void* x, int K) {
  PerThread& pt = per_thread_[tid];
  if (m_.wf_.is_block())
    block_matmul(block_kernel_, blk, static_cast<const uint16_t*>(x), M_, K, pt.tmp.data(), blk.N(), pt.scratch.data());
  else
    lin.run(streams_[tid], plan, x, pt.tmp.data(), pt.scratch.data());
}

// One function on purpose (about 110 lines): a thread's loop over the attention's work items (key chunks of a
// sample's prompt, suffix and own rows) carries the o_proj prefetch spread over those items, set up at its start.
void CpuSession::attention_phase(int tid, int l) {
  const int Hq = cfg_.Hq, Hkv = cfg_.Hkv, d = cfg_.d, group = Hq / Hkv, ld = Hq * d;
  const bool i8 = m_.wtype_ == WeightType::INT8;
  const size_t ostride = size_t(geo_.Rp) * geo_.dp;
  float* out_f32 = i8 ? act_f32_.data() : nullptr;
  uint16_t* out_bf16 = i8 ? nullptr : y_bf16_.data();
  auto out_off = [&](int b) { return int64_t(b) * T_ * ld; };
  // The items also pull this thread's o_proj weights into L2, each its share by work, so that the
  // thread's items cover them about once. (The whole slice per item cost a visible share of attention at the
  // seed's size: 16 items per thread re-read 3 MB each from L3; docs/PERFORMANCE.md.)
  const char* pf_base = nullptr;
  size_t pf_total = 0, pf_done = 0;
  {
    const OnednnLinear& o = m_.layers_[l].o[tid];
    const OnednnPlan& op = plans_[l][tid].o;
    pf_base = op.own_weights ? static_cast<const char*>(op.own_weights.get_data_handle()) : o.packed_data();
    pf_total = op.own_weights ? op.own_bytes() : o.packed_bytes();
    if (m_.use_fma_) {  // this thread's own o_proj chunks (others take some only when it falls behind)
      const FmaLinear& fo = m_.layers_[l].fo;
      pf_base = fo.thread_data(tid);
      pf_total = fo.thread_bytes(tid);
    }
    if (m_.wf_.is_block() && !m_.layers_[l].bo[tid].parts.empty()) {
      const BlockWeights& bo = m_.layers_[l].bo[tid].parts.front();
      pf_base = reinterpret_cast<const char*>(bo.data());
      pf_total = bo.bytes();
    }
  }
  const double pf_per_work = items_work_ > 0 ? double(pf_total) * nthreads_ / double(items_work_) : 0.0;
  for (;;) {
    const int idx = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (idx >= static_cast<int>(items_.size())) break;
    const AttnItem& it = items_[idx];
    float* O = part_o_.data() + it.slot * ostride;
    float* m = part_m_.data() + size_t(it.slot) * geo_.Rp;
    float* lsum = part_l_.data() + size_t(it.slot) * geo_.Rp;
    const int b = it.b, p = kv_.prompt(b);
    const int64_t pg = int64_t(p) * Hkv + it.g, bg = int64_t(b) * Hkv + it.g;
    // Prompt rows start after the left padding.
    const size_t prompt_off = size_t(pg * P_ + kv_.pad(p)) * d;
    const int prompt_rows = static_cast<int>(kv_.valid_len[p] - kv_.pad(p));
    KeyRows kv;
    AttnGeometry geo = geo_;
    geo.qld = qld(b);
    const bool i8kv = m_.kv_int8_;
    kv.int8 = i8kv;
    auto set_prompt = [&] {
      kv.S = prompt_rows;
      if (i8kv) {
        kv.i8[0] = i8_prompt_[l].segment(i8_prompt_row0_[pg], d);
      } else {
        kv.k_cache = k_cache_[l] ? k_cache_[l] + prompt_off : nullptr;
        kv.v_cache = v_cache_[l] ? v_cache_[l] + prompt_off : nullptr;
        if (k_map_[l].data) kv.k_map = row_map(k_map_[l], false, p, it.g, kv_.pad(p));
        if (v_map_[l].data) kv.v_map = row_map(v_map_[l], false, p, it.g, kv_.pad(p));
      }
    };
    if (it.prompt >= 0) {  // cascade: every sample of the prompt, prompt rows only
      set_prompt();
      geo.R = geo.Rp = it.count * geo_.Rp;
    } else {
      if (!shares_prompt(b)) set_prompt();
      if (i8kv ? !i8_suffix_.empty() : !ks_cache_.empty()) {
        kv.S2 = static_cast<int>(kv_.suffix(b));
        if (i8kv) {
          kv.i8[1] = i8_suffix_[l].segment(i8_suffix_row0_[bg], d);
        } else {
          kv.k_mid = ks_cache_[l] ? ks_cache_[l] + size_t(bg) * Q_ * d : nullptr;
          kv.v_mid = vs_cache_[l] ? vs_cache_[l] + size_t(bg) * Q_ * d : nullptr;
          if (ks_map_[l].data) kv.k_mid_map = row_map(ks_map_[l], true, b, it.g, 0);
          if (vs_map_[l].data) kv.v_mid_map = row_map(vs_map_[l], true, b, it.g, 0);
        }
      }
      const size_t own = size_t(bg) * T_;
      if (i8kv) {
        kv.i8[2] = i8_own_.segment(own, d);
      } else {
        kv.k_own = k_own_.data() + own * d;
        kv.v_own = v_own_.data() + own * d;
      }
    }
    const size_t share = (size_t(pf_per_work * double(int64_t(it.j1 - it.j0) * it.count)) + 63) / 64 * 64;
    kv.prefetch = pf_base + pf_done;
    kv.prefetch_bytes = std::min(share, pf_total - pf_done);
    pf_done += kv.prefetch_bytes;
    uint32_t* q = it.prompt >= 0 ? qptr(members_[p][0], it.g) : qptr(b, it.g);
    init_partial(geo, O, m, lsum);
    attend_chunk(attn_kernel_, geo, q, kv, it.j0, it.j1, O, m, lsum, per_thread_[tid].attn);
    if (single_chunk_)
      merge_partials(geo_, 1, O, m, lsum, T_, group, it.g * group, ld, out_f32 ? out_f32 + out_off(b) : nullptr,
                     out_bf16 ? out_bf16 + out_off(b) : nullptr);
  }
  if (!single_chunk_) {
    barrier(tid, kAttn);
    std::vector<const float*> op, mp, lp;
    for (int bg = tid; bg < B_ * Hkv; bg += nthreads_) {
      const int b = bg / Hkv, g = bg % Hkv;
      op.clear(); mp.clear(); lp.clear();
      for (int s : merge_slots_[bg]) {
        op.push_back(part_o_.data() + s * ostride);
        mp.push_back(part_m_.data() + size_t(s) * geo_.Rp);
        lp.push_back(part_l_.data() + size_t(s) * geo_.Rp);
      }
      merge_partials(geo_, static_cast<int>(op.size()), op.data(), mp.data(), lp.data(), T_, group, g * group, ld,
                     out_f32 ? out_f32 + out_off(b) : nullptr, out_bf16 ? out_bf16 + out_off(b) : nullptr);
    }
  }
  if (i8) {
    barrier(tid, kAttn);
    const int r0 = M_ * tid / nthreads_, r1 = M_ * (tid + 1) / nthreads_;
    quantize_rows(act_f32_.data(), r0, r1, ld, y_u8_.data(), y_scale_.data());
  }
}

void CpuSession::record_profile(double step_ms) {
  static const char* names[kPhases] = {"rms_norm",          "qkv matmul",         "q/k norm + rope",
                                       "attention",         "o_proj + residual",  "rms_norm2",
                                       "gate_up + silu*mul", "down + residual"};
  StepProfile& pr = profile_;
  pr = StepProfile{};
  pr.weights = m_.opts_.weights;
  pr.threads = nthreads_;
  pr.B = B_;
  pr.T = T_;
  pr.L = cfg_.L;
  for (int b = 0; b < B_; ++b) pr.s_max = std::max(pr.s_max, kv_.attended(b));
  for (int p = 0; p < kPhases; ++p) {
    // idle: the threads' mean share of the phase spent waiting at its barriers (uneven work, or a thread the OS
    // or the hypervisor held back).
    double idle = 0;
    for (const PerThread& pt : per_thread_) idle += pt.busy_s[p] > 0 ? pt.wait_s[p] / pt.busy_s[p] : 0.0;
    idle /= per_thread_.empty() ? 1.0 : double(per_thread_.size());
    pr.phases.push_back({names[p], phase_s_[p], idle});
  }
  pr.wall_seconds = 1e-3 * step_ms;
  // Which kernel each op runs and why, then the step's floor at the measured peaks (measured once per process,
  // at bind, on this session's thread count) against the phases above.
  pr.isa = m_.isa().describe();
  for (const KernelChoice& c : m_.kernel_choices())
    pr.kernels.push_back({c.op, c.kernel, c.why, c.gflops, c.unit, c.instruction, c.check});
  pr.kernel_pin = kernel_pin(m_.kernel_choices());
  std::vector<long long> keys(B_);
  long long rows = 0;  // distinct cache rows: a prompt shared by samples read once
  std::vector<bool> prompt_seen(kv_.valid_len.size(), false);
  for (int b = 0; b < B_; ++b) {
    keys[b] = kv_.attended(b) + T_;
    const int g = kv_.prompt(b);
    rows += kv_.suffix(b) + T_ + (prompt_seen[g] ? 0 : kv_.valid_len[g] - kv_.pad(g));
    prompt_seen[g] = true;
  }
  const StepWork work = step_work(cfg_.L, cfg_.D, cfg_.Hq, cfg_.Hkv, cfg_.d, cfg_.I, T_, keys, m_.opts_.weights,
                                  m_.kv_int8_, rows);
  std::vector<OpFloor> floors =
      step_floors(work, m_.kernel_choices(), m_.opts_.weights, nthreads_, m_.kv_int8_, m_.isa().usable);
  floors[0].actual_ms = 1e3 * (phase_s_[kQkv] + phase_s_[kOproj] + phase_s_[kGateUp] + phase_s_[kDown]);
  floors[1].actual_ms = 1e3 * phase_s_[kAttn];
  for (const OpFloor& f : floors)
    pr.ops.push_back({f.op, f.kernel, f.instruction, f.gflop, f.peak, f.floor_ms, f.actual_ms, f.gbytes, f.read_gbs,
                      f.compute_ms, f.memory_ms});
  pr.peak_threads = nthreads_;
}

}  // namespace alpamayo::cpu
