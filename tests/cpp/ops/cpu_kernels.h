// The cpu backend's kernels in the op suite (op_suite.h), listed from its own kernel lists: the matmul candidates
// (kMatmulKernels and oneDNN, cpu_backend.cpp's choose_matmul), the block-format kernels (kBlockKernels), the
// attention kernels (kAttnKernels) for each KV cache format they read, and the row kernels of cpu_ops.h.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "alpamayo/error.h"
#include "backends/cpu/runtime/aligned.h"
#include "backends/cpu/attention/attention.h"
#include "backends/cpu/matmul/bfp_matmul.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/matmul/matmul_kernels.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/matmul/onednn_matmul.h"
#include "backends/cpu/runtime/thread_pool.h"
#include "backends/kv_int8.h"
#include "backends/cpu/action_proj.h"
#include "ops/op_suite.h"

namespace alpamayo::opsuite::cpu_kernels {

using namespace alpamayo::cpu;

// A linear's raw output y [M, ldy] (columns past N must be untouched: NaN) through the backend's epilogue: copy_rows
// into fresh rows, or add_rows onto the residual h; rs, corr, cs: the int8 scales and correction (null for bf16).
inline std::vector<float> linear_epilogue(const OpShape& s, const OpData& d, const std::vector<float>& y, int ldy,
                                          const float* rs, const float* corr, const float* cs) {
  const int M = s.M, N = s.N;
  std::vector<float> yc(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < ldy; ++n) {
      const float v = y[size_t(m) * ldy + n];
      if (n < N) yc[size_t(m) * N + n] = v;
      else EXPECT_TRUE(std::isnan(v)) << "wrote past column N at " << m << "," << n;
    }
  const int ldo = N + 1;  // a column past N that must stay untouched
  std::vector<float> out(size_t(M) * ldo, NAN);
  if (s.residual) {
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) out[size_t(m) * ldo + n] = d.h[size_t(m) * N + n];
    add_rows(out.data(), ldo, yc.data(), N, M, N, rs, corr, cs);
  } else {
    copy_rows(out.data(), ldo, yc.data(), M, N, rs, corr, cs);
  }
  std::vector<float> r(size_t(M) * N);
  for (int m = 0; m < M; ++m) {
    EXPECT_TRUE(std::isnan(out[size_t(m) * ldo + N])) << "epilogue wrote past column N in row " << m;
    for (int n = 0; n < N; ++n) r[size_t(m) * N + n] = out[size_t(m) * ldo + n];
  }
  return r;
}

// x as the backend's int8 activations: u8 = q + 128 per row, with the row scales.
struct Int8Rows {
  std::vector<uint8_t> q;
  std::vector<float> scale;
};
inline Int8Rows quantize_x(const OpShape& s, const OpData& d, int ldx) {
  Int8Rows r{std::vector<uint8_t>(size_t(s.M) * ldx, 128), std::vector<float>(s.M)};
  std::vector<uint8_t> q(size_t(s.M) * s.K);
  quantize_rows(d.x.data(), 0, s.M, s.K, q.data(), r.scale.data());
  for (int m = 0; m < s.M; ++m)
    for (int k = 0; k < s.K; ++k) r.q[size_t(m) * ldx + k] = q[size_t(m) * s.K + k];
  return r;
}
inline std::vector<uint16_t> bf16_x(const OpShape& s, const OpData& d, int ldx) {
  std::vector<uint16_t> x(size_t(s.M) * ldx, 0);
  for (int m = 0; m < s.M; ++m)
    for (int k = 0; k < s.K; ++k) x[size_t(m) * ldx + k] = f32_to_bf16(d.x[size_t(m) * s.K + k]);
  return x;
}

// oneDNN's matmul: "" where the backend may run it for this weight type.
inline std::string onednn_unavailable(WeightType wt) {
  if (wt == WeightType::INT8 && !onednn_int8_refused().empty()) return onednn_int8_refused();
  isa();  // the ISA cap reaches oneDNN before its first primitive
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  OnednnPrimitives kernels(eng);
  try {  // e.g. no bf16 matmul in oneDNN below AVX-512
    kernels.get(wt, 64, 1536, 1024, 1024);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::vector<float> run_onednn(const OpShape& s, const OpData& d, WeightType wt) {
  const int ldy = s.N + 3;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  OnednnPrimitives kernels(eng);
  ScopedOmpThreads one(1);
  OnednnLinear lin;
  lin.pack(kernels, wt, s.K, s.N, d.W.data(), 7, ldy);  // packed for another M, planned for M below
  const OnednnPlan plan = lin.plan(kernels, s.M, ldy);
  AlignedBuf<uint8_t> scratch(plan.scratch_bytes() + 1);
  std::vector<float> y(size_t(s.M) * ldy, NAN);
  if (wt == WeightType::BF16) {
    lin.run(st, plan, bf16_x(s, d, s.K).data(), y.data(), scratch.data());
    EXPECT_EQ(lin.col_correction(), nullptr);
    return linear_epilogue(s, d, y, ldy, nullptr, nullptr, nullptr);
  }
  const Int8Rows xq = quantize_x(s, d, s.K);
  lin.run(st, plan, xq.q.data(), y.data(), scratch.data());
  return linear_epilogue(s, d, y, ldy, xq.scale.data(), lin.col_correction(), lin.col_scale());
}

// x with a row stride past K, as the backend's activation rows may have.
inline int strided(int K) { return K + 3; }

inline std::vector<float> run_matmul_kernel(const OpShape& s, const OpData& d, MatmulKernel k, bool int8) {
  const int ldy = s.N + 3, ldx = strided(s.K);
  MatmulWeights w;
  if (int8) w.pack_int8(k, d.W.data(), s.K, s.N);
  else w.pack(k, d.W.data(), s.K, s.N);
  AlignedBuf<uint8_t> scratch(matmul_scratch_bytes(k, s.M, s.K));
  std::vector<float> y(size_t(s.M) * ldy, NAN);
  if (!int8) {
    run_matmul(w, bf16_x(s, d, ldx).data(), s.M, ldx, y.data(), ldy, scratch.data());
    return linear_epilogue(s, d, y, ldy, nullptr, nullptr, nullptr);
  }
  const Int8Rows xq = quantize_x(s, d, ldx);
  run_matmul(w, xq.q.data(), s.M, ldx, y.data(), ldy, scratch.data());
  return linear_epilogue(s, d, y, ldy, xq.scale.data(), w.col_correction(), w.col_scale());
}

inline std::vector<float> run_block(const OpShape& s, const OpData& d, BlockKernel k, BlockStore store) {
  const int ldy = s.N + 3, ldx = strided(s.K);
  BlockWeights w;
  w.pack(store, d.W.data(), s.K, s.N);
  AlignedBuf<uint8_t> scratch(block_scratch_bytes());
  std::vector<float> y(size_t(s.M) * ldy, NAN);
  block_matmul(k, w, bf16_x(s, d, ldx).data(), s.M, ldx, y.data(), ldy, scratch.data());
  return linear_epilogue(s, d, y, ldy, nullptr, nullptr, nullptr);
}

inline void add_linear(std::vector<OpKernel>& v) {
  for (const bool int8 : {false, true}) {
    const std::string format = int8 ? "int8" : "bf16";
    const WeightType wt = int8 ? WeightType::INT8 : WeightType::BF16;
    v.push_back(op_kernel("cpu", Op::Linear, format, "onednn", [wt] { return onednn_unavailable(wt); },
                 [wt](const OpShape& s, const OpData& d) { return run_onednn(s, d, wt); }));
    for (MatmulKernel k : kMatmulKernels)
      if (int8 ? matmul_kernel_takes_int8(k) : matmul_kernel_takes_bf16(k))
        v.push_back(op_kernel("cpu", Op::Linear, format, matmul_kernel_name(k),
                              [k] { return matmul_kernel_unavailable(k); },
                     [k, int8](const OpShape& s, const OpData& d) { return run_matmul_kernel(s, d, k, int8); }));
  }
  // The block formats' kernels, also on the matrices a block-format model keeps in bf16.
  const std::pair<const char*, BlockStore> stores[] = {
      {"bf16", BlockStore::BF16}, {"bfp8_b", BlockStore::BFP8_B}, {"bfp4_b", BlockStore::BFP4_B}};
  for (const auto& [format, store] : stores)
    for (BlockKernel k : kBlockKernels)
      v.push_back(op_kernel("cpu", Op::Linear, format, std::string("block_") + block_kernel_name(k),
                   [k] {
                     return k == BlockKernel::Portable || block_kernel_avx512_available()
                                ? std::string()
                                : "needs AVX-512 with AVX512-BF16 (usable here: " + isa().describe() + ")";
                   },
                   [k, store](const OpShape& s, const OpData& d) { return run_block(s, d, k, store); }));
}


// One KV head's rows of a segment [Hkv, rows, d] or of the own rows [T, Hkv, d], as the cache stores them: bf16, and
// for an int8 cache also int8 with per-row scales (keys u8 = q + 128, values s8).
struct HeadRows {
  std::vector<uint16_t> k, v;
  std::vector<uint8_t> k8;
  std::vector<int8_t> v8;
  std::vector<float> ks, vs;
  HeadRows(const float* k_src, const float* v_src, int rows, int d, int64_t row_stride, bool int8)
      : k(size_t(rows) * d), v(k.size()), k8(int8 ? k.size() : 0), v8(k8.size()), ks(int8 ? rows : 0), vs(ks.size()) {
    for (int r = 0; r < rows; ++r) {
      const float *kr = k_src + r * row_stride, *vr = v_src + r * row_stride;
      for (int i = 0; i < d; ++i) k[size_t(r) * d + i] = f32_to_bf16(kr[i]), v[size_t(r) * d + i] = f32_to_bf16(vr[i]);
      if (int8) {
        ks[r] = store_int8_key_row(kr, d, k8.data() + size_t(r) * d);
        vs[r] = store_int8_value_row(vr, d, v8.data() + size_t(r) * d);
      }
    }
  }
  KeyRows::Int8Segment i8() const { return {k8.data(), v8.data(), ks.data(), vs.data()}; }
};

// One KV head's query rows r = hh * T + t (hh < group) as bf16 pairs qp[i * Rp + r].
inline AlignedBuf<uint32_t> query_pairs(const OpShape& s, const OpData& d, const AttnGeometry& g, int h) {
  const int group = s.Hq / s.Hkv;
  AlignedBuf<uint32_t> qp(size_t(s.d / 2) * g.Rp);
  for (size_t i = 0; i < qp.size(); ++i) qp[i] = 0;
  for (int hh = 0; hh < group; ++hh)
    for (int t = 0; t < s.T; ++t) {
      const float* x = d.q.data() + (size_t(t) * s.Hq + h * group + hh) * s.d;
      for (int i = 0; i < s.d / 2; ++i)
        qp[size_t(i) * g.Rp + hh * s.T + t] = f32_to_bf16(x[2 * i]) | (uint32_t(f32_to_bf16(x[2 * i + 1])) << 16);
    }
  return qp;
}

// Each KV head's keys [cache rows, suffix rows, own rows] in s.chunks partials, merged by the backend's merge.
inline std::vector<float> run_attention(const OpShape& s, const OpData& d, AttnKernel kernel, bool int8) {
  const int group = s.Hq / s.Hkv;
  const AttnGeometry g = AttnGeometry::make(s.d, group, s.T);
  AttnScratch scratch;
  scratch.resize(g, attn_kernel_is_fp32(kernel), int8, attn_kernel_is_amx(kernel));
  std::vector<float> out(size_t(s.T) * s.Hq * s.d, NAN);
  for (int h = 0; h < s.Hkv; ++h) {
    const AlignedBuf<uint32_t> qp = query_pairs(s, d, g, h);
    const HeadRows cache(d.k_cache.data() + size_t(h) * s.P * s.d, d.v_cache.data() + size_t(h) * s.P * s.d, s.S, s.d,
                         s.d, int8),
        mid(d.k_mid.data() + size_t(h) * s.S2 * s.d, d.v_mid.data() + size_t(h) * s.S2 * s.d, s.S2, s.d, s.d, int8),
        own(d.k_own.data() + size_t(h) * s.d, d.v_own.data() + size_t(h) * s.d, s.T, s.d, int64_t(s.Hkv) * s.d, int8);
    KeyRows kv;
    kv.k_cache = cache.k.data(), kv.v_cache = cache.v.data(), kv.S = s.S;
    kv.k_mid = mid.k.data(), kv.v_mid = mid.v.data(), kv.S2 = s.S2;
    kv.k_own = own.k.data(), kv.v_own = own.v.data();
    if (int8) {
      kv.int8 = true;
      kv.i8[0] = cache.i8(), kv.i8[1] = mid.i8(), kv.i8[2] = own.i8();
    }
    const int n = s.S + s.S2 + s.T;
    AlignedBuf<float> O(size_t(s.chunks) * g.Rp * g.dp), m(size_t(s.chunks) * g.Rp), l(size_t(s.chunks) * g.Rp);
    for (int ch = 0; ch < s.chunks; ++ch) {
      float* Oc = O.data() + size_t(ch) * g.Rp * g.dp;
      init_partial(g, Oc, m.data() + ch * g.Rp, l.data() + ch * g.Rp);
      attend_chunk(kernel, g, qp.data(), kv, n * ch / s.chunks, n * (ch + 1) / s.chunks, Oc, m.data() + ch * g.Rp,
                   l.data() + ch * g.Rp, scratch);
    }
    merge_partials(g, s.chunks, O.data(), m.data(), l.data(), s.T, group, h * group, s.Hq * s.d, out.data(), nullptr);
  }
  return out;
}

// avx512_vnni rounds each query row to int8 (scale: the row's largest |q| / 127, as kv_int8.h) by design.
inline void round_queries_s8(const OpShape& s, OpData& d) {
  std::vector<int8_t> q8(s.d);
  for (size_t r = 0; r < d.q.size() / s.d; ++r)
    dequantize_row_s8(q8.data(), quantize_row_s8(d.q.data() + r * s.d, s.d, q8.data()), s.d, d.q.data() + r * s.d);
}

inline void add_attention(std::vector<OpKernel>& v) {
  for (const bool int8 : {false, true})
    for (AttnKernel k : kAttnKernels) {
      if (attn_kernel_unavailable(k, int8).rfind("reads only", 0) == 0) continue;  // not a kernel for this cache
      OpKernel e = op_kernel("cpu", Op::Attention, int8 ? "int8" : "bf16", attn_kernel_name(k),
                 [k, int8] { return attn_kernel_unavailable(k, int8); },
                 [k, int8](const OpShape& s, const OpData& d) { return run_attention(s, d, k, int8); });
      if (k == AttnKernel::Avx512Vnni) e.reference_inputs = round_queries_s8, e.print_unrounded = true;
      // bf16 probabilities (avx512_bf16, amx_bf16, portable) differ from the oracle by their rounding: relative 2^-9 per
      // weight, averaging out over keys; measured <= 0.1% of the largest output, bound 0.5%. The fp32 kernels
      // differ by summation order and the exp2 polynomial only: bound 0.01%. avx512_vnni rounds the probabilities
      // (times the value scales) to 15 bits per row and block: measured <= 2.1e-4 of the largest output, bound 1e-3.
      e.max_rel = k == AttnKernel::Avx512Vnni ? 1e-3 : attn_kernel_is_fp32(k) ? 1e-4 : 5e-3;
      v.push_back(std::move(e));
    }
}


// rms_norm: s.M rows of s.N; the output format "f32" (the final norm), "bf16" or "int8" (a linear's activations).
inline std::vector<float> run_rms_norm(const OpShape& s, const OpData& d, const std::string& format) {
  const int rows = s.M, n = s.N;
  std::vector<float> y(size_t(rows) * n), tmp(n), scale(rows);
  if (format == "f32") {
    rms_norm_rows_f32(d.x.data(), d.w.data(), 0, rows, n, d.eps, y.data());
  } else if (format == "bf16") {
    std::vector<uint16_t> yb(y.size());
    rms_norm_rows(d.x.data(), d.w.data(), 0, rows, n, d.eps, tmp.data(), yb.data(), nullptr, nullptr);
    for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_to_f32(yb[i]);
  } else {
    std::vector<uint8_t> yq(y.size());
    rms_norm_rows(d.x.data(), d.w.data(), 0, rows, n, d.eps, tmp.data(), nullptr, yq.data(), scale.data());
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < n; ++i) y[size_t(r) * n + i] = float(int(yq[size_t(r) * n + i]) - 128) * scale[r];
  }
  return y;
}

// head_norm_rope on every (token, head) row of x [T, Hq, d], with the tables' row t.
inline std::vector<float> run_qk_norm_rope(const OpShape& s, const OpData& d) {
  std::vector<float> x = d.x, tmp(s.d);
  for (int t = 0; t < s.T; ++t)
    for (int h = 0; h < s.Hq; ++h)
      head_norm_rope(x.data() + (size_t(t) * s.Hq + h) * s.d, s.d, d.w.data(), d.eps, d.cos.data() + size_t(t) * s.d,
                     d.sin.data() + size_t(t) * s.d, tmp.data());
  return x;
}

// The int8 weights' epilogue that silu_mul_rows applies to the raw gate_up output: row scales, the +128 correction
// and the column scales (2n columns). Fixed values of the size the backend sees.
struct SiluEpilogue {
  std::vector<float> rs, corr, cs;
  SiluEpilogue(int M, int n) : rs(M), corr(2 * n), cs(2 * n) {
    for (int r = 0; r < M; ++r) rs[r] = r % 3 == 0 ? 1.f : r % 3 == 1 ? 0.5f : 2.f;
    for (int c = 0; c < 2 * n; ++c) corr[c] = 0.01f * float(c % 20), cs[c] = 1.f + 0.1f * float(c % 20);
  }
};

// silu_mul: x [M, 2N] the gate_up rows; "f32": fp32 output behind the int8 epilogue, "bf16": bf16 output behind
// bf16's (none).
inline std::vector<float> run_silu_mul(const OpShape& s, const OpData& d, bool f32) {
  const int M = s.M, n = s.N;
  std::vector<float> out(size_t(M) * n);
  if (f32) {
    const SiluEpilogue e(M, n);
    silu_mul_rows(d.x.data(), M, n, e.rs.data(), e.corr.data(), e.cs.data(), n, nullptr, out.data());
  } else {
    std::vector<uint16_t> ob(out.size());
    silu_mul_rows(d.x.data(), M, n, nullptr, nullptr, nullptr, n, ob.data(), nullptr);
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(ob[i]);
  }
  return out;
}
inline void apply_silu_epilogue(const OpShape& s, OpData& d) {
  const SiluEpilogue e(s.M, s.N);
  for (int r = 0; r < s.M; ++r)
    for (int c = 0; c < 2 * s.N; ++c) {
      float& v = d.x[size_t(r) * 2 * s.N + c];
      v = (v - e.corr[c]) * e.cs[c] * e.rs[r];
    }
}

inline void add_rows_ops(std::vector<OpKernel>& v) {
  const auto runs = [] { return std::string(); };  // plain C++: runs everywhere
  for (const std::string f : {"f32", "bf16", "int8"})
    v.push_back(op_kernel("cpu", Op::RmsNorm, f, f == "f32" ? "rms_norm_rows_f32" : "rms_norm_rows", runs,
                 [f](const OpShape& s, const OpData& d) { return run_rms_norm(s, d, f); }));
  v.push_back(op_kernel("cpu", Op::QkNormRope, "f32", "head_norm_rope", runs, run_qk_norm_rope));
  for (const bool f32 : {true, false}) {
    OpKernel e = op_kernel("cpu", Op::SiluMul, f32 ? "f32" : "bf16", "silu_mul_rows", runs,
               [f32](const OpShape& s, const OpData& d) { return run_silu_mul(s, d, f32); });
    if (f32) e.reference_inputs = apply_silu_epilogue;
    v.push_back(std::move(e));
  }
  // The host-loop backends' action_in_proj (src/backends/cpu/action_proj.h).
  v.push_back(op_kernel("cpu", Op::ActionInProj, "f32", "host", runs, [](const OpShape& s, const OpData& d) {
                 std::vector<float> emb(size_t(s.B) * d.cfg.T * d.cfg.D);
                 HostProjections(d.cfg, d.mw, false).in(d.x.data(), d.t.data(), s.B, emb.data());
                 return emb;
               }));
}

inline BackendOps backend_ops() {
  BackendOps b{"cpu", {}, {}};
  add_linear(b.kernels);
  add_attention(b.kernels);
  add_rows_ops(b.kernels);
  b.not_covered.push_back(
      {Op::ActionOutProjEuler, "f32",
       "the host loop's (HostProjections::out and host_loop.cpp's Euler update, which the reference backend runs "
       "too): compared whole in Conformance.* (every v_k and the sampler's consistency)"});
  return b;
}

}  // namespace alpamayo::opsuite::cpu_kernels
