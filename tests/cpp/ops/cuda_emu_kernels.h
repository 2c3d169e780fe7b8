// The cuda backend's kernels in the op suite (op_suite.h), run from their own source on the host by the SIMT emulator
// (tests/cuda_emu/simt_emu.h): the instance `CudaEmu/Ops.*`. Included by tests/cuda_emu/test_cuda_kernels.cpp after
// it has included the kernels (*.cuh, namespace alpamayo::ALP_CUDA_NS::kern, ALP_CUDA_NS = cuda_emu there), so it
// builds with the test-only cuda_emu backend only. What the emulator checks is indexing, fragment layouts, masking
// and pipelines; the GPU itself is checked by the conformance suite on `cuda`.
#pragma once
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/op_suite.h"

namespace alpamayo::opsuite::cuda_emu_kernels {

using namespace alpamayo::ALP_CUDA_NS;

inline float e4m3(uint8_t q) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))); }

// The weights as the cuda backend quantises them for fp8 (quantize_rows_k): e4m3 per output row, the largest |w| of
// each row mapped to 448; the row scales become the matmul output's channel scales.
struct Fp8Rows {
  std::vector<uint8_t> q;
  std::vector<float> scale;
};
inline Fp8Rows fp8_rows(const float* W, int N, int K) {
  Fp8Rows r{std::vector<uint8_t>(size_t(N) * K), std::vector<float>(N)};
  simt::launch(kern::quantize_rows_k, dim3(N), dim3(kern::kRowThreads), 0, W, K, r.q.data(), r.scale.data());
  return r;
}
// fp8: the kernel multiplies the e4m3 values and the consumers scale by the channel's scale (W8A16).
inline void fp8_weights(const OpShape& s, OpData& d) {
  const Fp8Rows r = fp8_rows(d.W.data(), s.N, s.K);
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < s.K; ++k) d.W[size_t(n) * s.K + k] = e4m3(r.q[size_t(n) * s.K + k]) * r.scale[n];
}

// linear: skinny_gemm_k with split-K (more splits for longer K), then residual_rmsnorm_k's residual update h += y,
// which sums the splits in order and applies the channel scales (MatOut); h is zero without a residual.
inline std::vector<float> run_linear(const OpShape& s, const OpData& d, bool fp8) {
  const int M = s.M, N = s.N, K = s.K;
  const std::vector<uint16_t> xb = to_bf16(d.x.data(), d.x.size());
  std::vector<uint8_t> w(size_t(N) * K * (fp8 ? 1 : 2));
  std::vector<float> cs;
  if (fp8) {
    Fp8Rows r = fp8_rows(d.W.data(), N, K);
    w = std::move(r.q), cs = std::move(r.scale);
  } else {
    for (size_t i = 0; i < d.W.size(); ++i) {
      const uint16_t h = f32_to_bf16(d.W[i]);
      std::memcpy(&w[2 * i], &h, 2);
    }
  }
  const int chunks = (K + kern::kKC - 1) / kern::kKC, wanted = K > 1024 ? 3 : K > 256 ? 2 : 1;
  const int per_split = (chunks + wanted - 1) / wanted, splits = (chunks + per_split - 1) / per_split;
  const size_t stride = size_t((M + kern::kTok - 1) / kern::kTok * kern::kTok) * N;
  std::vector<float> y(splits * stride, NAN);
  const dim3 grid((N + kern::kCh - 1) / kern::kCh, (M + kern::kTok - 1) / kern::kTok, splits);
  if (fp8)
    simt::launch(kern::skinny_gemm_k<true>, grid, dim3(kern::kGemmThreads), kern::GemmCfg<true>::kSmem, xb.data(),
                 w.data(), y.data(), M, N, K, per_split, stride);
  else
    simt::launch(kern::skinny_gemm_k<false>, grid, dim3(kern::kGemmThreads), kern::GemmCfg<false>::kSmem, xb.data(),
                 w.data(), y.data(), M, N, K, per_split, stride);
  std::vector<float> h = s.residual ? d.h : std::vector<float>(size_t(M) * N, 0.f), ones(N, 1.f), out(h.size()), rs(M);
  const MatOut view{y.data(), N, splits, stride, nullptr, fp8 ? cs.data() : nullptr};
  simt::launch(kern::residual_rmsnorm_k, dim3(M), dim3(kern::kRowThreads), 0, h.data(), view, ones.data(), N, 1e-6f,
               Act::F32, static_cast<void*>(out.data()), rs.data());
  return h;
}

// The split-K output a row kernel reads: x [M, n] as two partials x / 2 each, row scales 2 and channel scales 1/2,
// so that the value the kernel sees is x itself (every step exact in fp32).
struct SplitIn {
  std::vector<float> y, rs, cs;
  MatOut view;
  SplitIn(const std::vector<float>& x, int M, int n) : y(2 * x.size()), rs(M, 2.f), cs(n, 0.5f) {
    for (size_t i = 0; i < x.size(); ++i) y[i] = y[x.size() + i] = 0.5f * x[i];
    view = {y.data(), n, 2, x.size(), rs.data(), cs.data()};
  }
};

// A row kernel's output in mode `mode` as fp32 (fp8: times the row's scale).
inline std::vector<float> from_mode(const std::vector<uint8_t>& out, const std::vector<float>& rs, int M, int n,
                                    Act mode) {
  std::vector<float> v(size_t(M) * n);
  for (size_t i = 0; i < v.size(); ++i) {
    if (mode == Act::F32) std::memcpy(&v[i], &out[4 * i], 4);
    if (mode == Act::BF16) v[i] = bf16_to_f32(uint16_t(out[2 * i] | out[2 * i + 1] << 8));
    if (mode == Act::FP8) v[i] = e4m3(out[i]) * rs[i / n];
  }
  return v;
}

inline Act act_of(const std::string& f) { return f == "f32" ? Act::F32 : f == "bf16" ? Act::BF16 : Act::FP8; }

// rms_norm: residual_rmsnorm_k with h = 0 and the input as the matmul output it adds; fp8 writes its row scales over
// the input's (in place, as the backend does).
inline std::vector<float> run_rms_norm(const OpShape& s, const OpData& d, Act mode) {
  SplitIn in(d.x, s.M, s.N);
  std::vector<float> h(d.x.size(), 0.f), out_rs(s.M);
  std::vector<uint8_t> out(d.x.size() * 4);
  float* rs_out = mode == Act::FP8 ? in.rs.data() : out_rs.data();
  simt::launch(kern::residual_rmsnorm_k, dim3(s.M), dim3(kern::kRowThreads), 0, h.data(), in.view, d.w.data(), s.N,
               d.eps, mode, static_cast<void*>(out.data()), rs_out);
  return from_mode(out, in.rs, s.M, s.N, mode);
}

// qk_norm_rope: x [T, Hq, d] as the query heads of a qkv output of one sample (no key or value heads), the same
// norm weights and tables; the kernel writes q [Hq, T, d] in bf16.
inline std::vector<float> run_qk_norm_rope(const OpShape& s, const OpData& d) {
  const int M = s.T, heads = s.Hq;
  SplitIn in(d.x, M, heads * s.d);
  std::vector<uint16_t> q(d.x.size());
  const int blocks = (M * heads + kern::kHeadWarps - 1) / kern::kHeadWarps;
  simt::launch(kern::qk_norm_rope_k, dim3(blocks), dim3(kern::kHeadWarps * 32), kern::kHeadWarps * s.d * sizeof(float),
               in.view, d.w.data(), d.w.data(), d.cos.data(), d.sin.data(), M, s.T, s.Hq, 0, s.d, d.eps, q.data(),
               nullptr, nullptr);
  std::vector<float> v(d.x.size());
  for (int t = 0; t < s.T; ++t)
    for (int h = 0; h < s.Hq; ++h)
      for (int i = 0; i < s.d; ++i)
        v[(size_t(t) * s.Hq + h) * s.d + i] = bf16_to_f32(q[(size_t(h) * s.T + t) * s.d + i]);
  return v;
}

// silu_mul: the gate_up output [M, 2n]; bf16 or fp8 (row scales over the input's) output.
inline std::vector<float> run_silu_mul(const OpShape& s, const OpData& d, Act mode) {
  SplitIn in(d.x, s.M, 2 * s.N);
  std::vector<uint8_t> out(size_t(s.M) * s.N * 2);
  std::vector<float> rs(s.M);
  float* rs_out = mode == Act::FP8 ? in.rs.data() : rs.data();
  simt::launch(kern::silu_mul_k, dim3(s.M), dim3(kern::kRowThreads), 0, in.view, s.N, mode,
               static_cast<void*>(out.data()), rs_out);
  return from_mode(out, in.rs, s.M, s.N, mode);
}

// attention: one sample, q [Hq, T, d], the cache's P rows per head as a paged pool read through a page table (pages
// of 16 rows, token-major [pages, 16, Hkv, d], in reverse order with a NaN page between each two; rows past S
// poisoned with NaN: reading one poisons the output), the middle segment (S2 rows) as the sample's dense suffix, own
// rows [Hkv, T, d]; the key sequence cut into s.chunks items (multiples of 64 keys, crossing the segments'
// boundaries), then merged.
inline std::vector<float> run_attention(const OpShape& s, const OpData& d) {
  const int group = s.Hq / s.Hkv, R = group * s.T, tiles = (R + 127) / 128, n = s.S + s.S2 + s.T;
  std::vector<uint16_t> qb(d.q.size()), kob(d.k_own.size()), vob(d.v_own.size());
  for (int t = 0; t < s.T; ++t) {
    for (int h = 0; h < s.Hq; ++h)
      for (int i = 0; i < s.d; ++i)
        qb[(size_t(h) * s.T + t) * s.d + i] = f32_to_bf16(d.q[(size_t(t) * s.Hq + h) * s.d + i]);
    for (int h = 0; h < s.Hkv; ++h)
      for (int i = 0; i < s.d; ++i) {
        kob[(size_t(h) * s.T + t) * s.d + i] = f32_to_bf16(d.k_own[(size_t(t) * s.Hkv + h) * s.d + i]);
        vob[(size_t(h) * s.T + t) * s.d + i] = f32_to_bf16(d.v_own[(size_t(t) * s.Hkv + h) * s.d + i]);
      }
  }
  std::vector<float> kc = d.k_cache, vc = d.v_cache;
  for (int h = 0; h < s.Hkv; ++h)
    for (size_t i = (size_t(h) * s.P + s.S) * s.d; i < size_t(h + 1) * s.P * s.d; ++i) kc[i] = vc[i] = NAN;
  constexpr int kPage = 16;
  const int pages = (s.P + kPage - 1) / kPage, pool_pages = 2 * pages;
  const size_t page_elems = size_t(kPage) * s.Hkv * s.d;
  std::vector<float> kpool(pool_pages * page_elems, NAN), vpool(kpool.size(), NAN);
  std::vector<int64_t> table(pages);
  for (int pg = 0; pg < pages; ++pg) {
    table[pg] = 2 * (pages - 1 - pg);  // odd pages stay NaN
    for (int i = pg * kPage; i < std::min(s.P, (pg + 1) * kPage); ++i)
      for (int h = 0; h < s.Hkv; ++h)
        for (int c = 0; c < s.d; ++c) {
          const size_t at = table[pg] * page_elems + (size_t(i % kPage) * s.Hkv + h) * s.d + c;
          kpool[at] = kc[(size_t(h) * s.P + i) * s.d + c];
          vpool[at] = vc[(size_t(h) * s.P + i) * s.d + c];
        }
  }
  const std::vector<uint16_t> kcb = to_bf16(kpool.data(), kpool.size()), vcb = to_bf16(vpool.data(), vpool.size());
  const std::vector<uint16_t> kmb = to_bf16(d.k_mid.data(), d.k_mid.size()), vmb = to_bf16(d.v_mid.data(), d.v_mid.size());
  const int chunk = ((n + s.chunks - 1) / s.chunks + 63) / 64 * 64;
  std::vector<AttnItem> items;
  std::vector<int> slot_list;
  for (int j0 = 0; j0 < n; j0 += chunk) {
    slot_list.push_back(int(items.size()));
    items.push_back({j0, std::min(n, j0 + chunk), 0, 0, s.S, 0, s.S2, s.T, 0, 1, int(items.size())});
  }
  const std::vector<int> members = {0}, range = {0, int(items.size())};
  std::vector<float> po(items.size() * s.Hkv * R * s.d, NAN), pm(items.size() * s.Hkv * R, NAN),
      pl(pm.size(), NAN), out(d.q.size(), NAN);
  AttnParams p;
  const KVView paged{nullptr, int64_t(page_elems), s.d, int64_t(s.Hkv) * s.d, table.data(), pages, 4};
  p.k_cache = paged, p.v_cache = paged, p.k_cache.base = kcb.data(), p.v_cache.base = vcb.data();
  p.q = qb.data(), p.k_own = kob.data(), p.v_own = vob.data();
  p.items = items.data(), p.members = members.data(), p.slot_list = slot_list.data(), p.slot_range = range.data();
  p.part_o = po.data(), p.part_m = pm.data();
  p.part_l = pl.data(), p.n_items = int(items.size()), p.B = 1, p.Hkv = s.Hkv, p.group = group, p.T = s.T;
  p.P = s.P, p.d = s.d, p.R = R, p.tiles = tiles;
  if (s.S2) {  // the middle segment: a dense suffix [1, Hkv, S2, d]
    p.k_suffix = {kmb.data(), int64_t(s.Hkv) * s.S2 * s.d, int64_t(s.S2) * s.d, s.d};
    p.v_suffix = {vmb.data(), int64_t(s.Hkv) * s.S2 * s.d, int64_t(s.S2) * s.d, s.d};
    p.Q = s.S2;
  }
  simt::launch(kern::attention_partial_k, dim3(p.n_items, s.Hkv, tiles), dim3(kern::kAttnThreads), kern::kAttnSmemBytes,
               p, 1.4426950408889634f / std::sqrt(float(s.d)));
  const int threads = s.Hkv * R * 32;
  simt::launch(kern::attention_merge_k, dim3((threads + 255) / 256), dim3(256), 0, p, Act::F32,
               static_cast<void*>(out.data()));
  return out;
}

// action_in_proj: Fourier features, the trunk (rms_norm_k, linear_f32_k) and the LayerNorm, as the cuda backend
// chains them, at flow time t[b] of each sample (the times table holds them as steps 0 .. B-1).
inline std::vector<float> run_action_in(const OpShape& s, const OpData& d) {
  const ExpertConfig& c = d.cfg;
  const int T = c.T, A = c.A, F = c.n_fourier, D = c.D, W0 = (A + 1) * F, layers = c.ain_layers;
  const std::vector<float> f = fourier_freqs(F, c.max_freq, true);
  std::vector<float> freqs;
  for (int i = 0; i <= A; ++i) freqs.insert(freqs.end(), f.begin(), f.end());
  std::vector<float> emb(size_t(s.B) * T * D);
  for (int b = 0; b < s.B; ++b) {  // one sample per launch: each has its own time
    const int M = T, width_max = std::max({W0, c.ain_hidden, D});
    std::vector<float> a(size_t(M) * width_max), y(a.size());
    simt::launch(kern::fourier_k, dim3((M * W0 + 255) / 256), dim3(256), 0, d.x.data() + size_t(b) * T * A,
                 d.t.data(), b, freqs.data(), M, A, F, a.data());
    int width = W0;
    for (int i = 0; i <= layers; ++i) {
      if (i > 0)
        simt::launch(kern::rms_norm_k, dim3(M), dim3(kern::kRowThreads), 0, a.data(),
                     static_cast<const float*>(d.mw.action_in.norm_w[i - 1].data), width, c.ain_norm_eps, a.data());
      const int out = i < layers ? c.ain_hidden : D;
      const dim3 grid((out + kern::kTile - 1) / kern::kTile, (M + kern::kTile - 1) / kern::kTile);
      simt::launch(kern::linear_f32_k, grid, dim3(kern::kTile, kern::kTile), 0, a.data(), M, width,
                   static_cast<const float*>(d.mw.action_in.linear_w[i].data),
                   static_cast<const float*>(d.mw.action_in.linear_b[i].data), out, i < layers, y.data());
      std::swap(a, y);
      width = out;
    }
    simt::launch(kern::layer_norm_k, dim3(M), dim3(kern::kRowThreads), 0, a.data(),
                 static_cast<const float*>(d.mw.action_in.ln_w.data),
                 static_cast<const float*>(d.mw.action_in.ln_b.data), D, c.ain_norm_eps,
                 emb.data() + size_t(b) * T * D);
  }
  return emb;
}

// action_out_proj + Euler: out_proj_euler_k at step 0 of the times {0, dt}: [v, x + dt v].
inline std::vector<float> run_action_out(const OpShape& s, const OpData& d) {
  const ExpertConfig& c = d.cfg;
  const int M = s.B * c.T, A = c.A, n = M * A;
  const float times[2] = {0.f, d.dt};
  std::vector<float> x = d.x, v(n), xo(n);
  simt::launch(kern::out_proj_euler_k, dim3((n * 32 + 255) / 256), dim3(256), 0, d.hidden.data(),
               static_cast<const float*>(nullptr), 0.f, 1.f, static_cast<const float*>(d.mw.action_out.w.data), static_cast<const float*>(d.mw.action_out.b.data), M,
               c.D, A, times, 0, x.data(), v.data(), xo.data());
  std::vector<float> r(v);
  r.insert(r.end(), x.begin(), x.end());
  // The Euler update bit for bit on the kernel's own v (fp32, no fused multiply-add, as on the host loop).
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(x[i], d.x[i] + (times[1] - times[0]) * v[i]) << "x_{k+1} at " << i;
    EXPECT_EQ(xo[i], x[i]) << "the kernel's copy of x_{k+1} at " << i;
  }
  return r;
}

inline BackendOps backend_ops() {
  BackendOps b{"cuda_emu", {}, {}};
  const auto runs = [] { return std::string(); };  // the emulator runs every kernel on any host
  for (const bool fp8 : {false, true}) {
    OpKernel k = op_kernel("cuda_emu", Op::Linear, fp8 ? "fp8" : "bf16", fp8 ? "skinny_fp8" : "skinny_bf16", runs,
                           [fp8](const OpShape& s, const OpData& d) { return run_linear(s, d, fp8); });
    const int align = fp8 ? 16 : 8;
    k.refuses = [align](const OpShape& s) {  // cuda_model.cpp checks the model's K
      return s.K % align ? "its K are multiples of " + std::to_string(align) + " (16-byte weight rows)" : "";
    };
    if (fp8) k.reference_inputs = fp8_weights, k.print_unrounded = true;
    b.kernels.push_back(std::move(k));
  }
  // Each row kernel's former bounds relative to the largest output (CudaKernels.*): bf16 output 4e-3, fp8 7e-2,
  // fp32 1e-6.
  for (const std::string f : {"f32", "bf16", "fp8"}) {
    OpKernel k = op_kernel("cuda_emu", Op::RmsNorm, f, "residual_rmsnorm", runs,
                           [f](const OpShape& s, const OpData& d) { return run_rms_norm(s, d, act_of(f)); });
    k.max_rel = f == "f32" ? 1e-6 : f == "bf16" ? 4e-3 : 7e-2;
    b.kernels.push_back(std::move(k));
  }
  OpKernel qk = op_kernel("cuda_emu", Op::QkNormRope, "bf16", "qk_norm_rope", runs, run_qk_norm_rope);
  qk.max_rel = 4e-3;
  qk.refuses = [](const OpShape& s) { return s.d % 8 ? "its head dims are multiples of 8" : ""; };
  b.kernels.push_back(std::move(qk));
  for (const std::string f : {"bf16", "fp8"}) {
    OpKernel k = op_kernel("cuda_emu", Op::SiluMul, f, "silu_mul", runs,
                           [f](const OpShape& s, const OpData& d) { return run_silu_mul(s, d, act_of(f)); });
    k.max_rel = f == "bf16" ? 4e-3 : 7e-2;
    b.kernels.push_back(std::move(k));
  }
  // Probabilities go through bf16 for the P V product: about 3 significant digits.
  OpKernel at = op_kernel("cuda_emu", Op::Attention, "bf16", "split_kv", runs, run_attention);
  at.max_rel = 1e-2;
  at.refuses = [](const OpShape& s) -> std::string {
    if (s.d % 8 || s.d > kAttnMaxHeadDim) return "its head dims are multiples of 8, at most " +
                                                   std::to_string(kAttnMaxHeadDim);
    return "";
  };
  b.kernels.push_back(std::move(at));
  // The action projections' former bounds against the host's: 1e-5 of the largest output.
  OpKernel in = op_kernel("cuda_emu", Op::ActionInProj, "f32", "fourier_trunk_layernorm", runs, run_action_in);
  in.max_rel = 1e-5;
  b.kernels.push_back(std::move(in));
  OpKernel out = op_kernel("cuda_emu", Op::ActionOutProjEuler, "f32", "out_proj_euler", runs, run_action_out);
  out.max_rel = 1e-5;
  b.kernels.push_back(std::move(out));
  // cuda_emu computes cuBLASLt's matmuls naively on the host (fake_cuda.h): no kernel of the backend to hold here.
  b.not_covered.push_back({Op::Linear, "bf16 (cuBLASLt)",
                           "the bf16 weights' matmul runs on cuBLASLt, on the GPU only: the conformance suite on "
                           "cuda"});
  return b;
}

}  // namespace alpamayo::opsuite::cuda_emu_kernels
