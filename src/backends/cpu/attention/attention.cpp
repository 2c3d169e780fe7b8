#include "backends/cpu/attention/attention.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/kernel_check.h"
#include "backends/cpu/kernel_registry.h"
#include "backends/cpu/attention/kv_quant.h"

namespace alpamayo::cpu {

AttnGeometry AttnGeometry::make(int d, int group, int T) {
  AttnGeometry g;
  g.d = d;
  g.dp = (d + 31) / 32 * 32;
  g.R = group * T;
  g.Rp = (g.R + 15) / 16 * 16;
  g.qld = g.Rp;
  g.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(d)));
  return g;
}

void AttnScratch::resize(const AttnGeometry& g, bool fp32, bool int8, bool amx) {
  qf.resize(fp32 ? size_t(g.dp) * (g.Rp + kFmaPad) : 0);
  kf.resize(fp32 ? size_t(kKeyBlock) * g.d : 0);
  vf.resize(fp32 ? size_t(kKeyBlock) * (g.dp + kFmaPad) : 0);
  const int keys = amx ? kAmxKeyBlock : kKeyBlock;  // per block
  kptr.resize(keys);
  vptr.resize(keys);
  // amx_bf16 holds the scores and probabilities of one row group, rows padded (kAmxPad).
  s.resize(std::max(size_t(kKeyBlock) * (g.Rp + (fp32 ? kFmaPad : 0)), amx ? size_t(keys + kAmxPad) * kAmxRowGroup : 0));
  p.resize(std::max(size_t(kKeyBlock / 2) * g.Rp, amx ? size_t(keys / 2 + kAmxPad) * kAmxRowGroup : 0));
  v.resize(size_t(keys / 2) * (g.dp + (amx ? kAmxPad : 0)));
  alpha.resize(g.Rp);
  lblk.resize(g.Rp);
  zero.resize(g.dp);
  k8ptr.resize(int8 ? keys : 0);
  v8ptr.resize(int8 ? keys : 0);
  kscale.resize(int8 ? keys : 0);
  vscale.resize(int8 ? keys : 0);
  q8.resize(int8 ? size_t(g.dp / 4) * g.Rp : 0);
  qscale.resize(int8 ? g.Rp : 0);
  qcorr.resize(int8 ? g.Rp : 0);
  pmax.resize(int8 ? g.Rp : 0);
  qa.resize(amx ? size_t(g.Rp) * g.dp : 0);
  kb.resize(amx ? size_t(g.dp / 2) * (keys + kAmxPad) : 0);
}

float store_int8_key_row(const float* x, int d, uint8_t* k8) {
  return quantize_row_avx2(x, false, d, 128, reinterpret_cast<int8_t*>(k8));
}

float store_int8_value_row(const float* x, int d, int8_t* v8) { return quantize_row_avx2(x, false, d, 0, v8); }

void store_int8_rows(const uint16_t* k, const uint16_t* v, size_t rows, int d, uint8_t* k8, int8_t* v8, float* ks,
                     float* vs) {
  for (size_t j = 0; j < rows; ++j) {
    ks[j] = quantize_row_avx2(k + j * d, true, d, 128, reinterpret_cast<int8_t*>(k8) + j * d);
    vs[j] = quantize_row_avx2(v + j * d, true, d, 0, v8 + j * d);
  }
}

void init_partial(const AttnGeometry& g, float* O, float* m, float* l) {
  std::fill(O, O + size_t(g.Rp) * g.dp, 0.f);
  std::fill(m, m + g.Rp, -INFINITY);
  std::fill(l, l + g.Rp, 0.f);
}

bool cpu_has_avx512_bf16() { return isa().has(kAvx512 | kAvx512Bf16); }

const char* attn_kernel_name(AttnKernel k) {
  switch (k) {
    case AttnKernel::Avx512Bf16: return "avx512_bf16";
    case AttnKernel::Avx512Vnni: return "avx512_vnni";
    case AttnKernel::Avx512Fma: return "avx512_fma";
    case AttnKernel::Avx2Fma: return "avx2_fma";
    case AttnKernel::AmxBf16: return "amx_bf16";
    case AttnKernel::Portable: return "portable";
  }
  return "?";
}

const char* attn_kernel_instruction(AttnKernel k) {
  switch (k) {
    case AttnKernel::Avx512Bf16: return "vdpbf16ps zmm";
    case AttnKernel::Avx512Vnni: return "vpdpbusd zmm + vpdpwssd zmm";
    case AttnKernel::Avx512Fma: return "vfmadd231ps zmm";
    case AttnKernel::Avx2Fma: return "vfmadd231ps ymm";
    case AttnKernel::AmxBf16: return "tdpbf16ps tmm";
    case AttnKernel::Portable: return "scalar";
  }
  return "?";
}

bool attn_kernel_is_fp32(AttnKernel k) { return k == AttnKernel::Avx512Fma || k == AttnKernel::Avx2Fma; }

bool attn_kernel_is_amx(AttnKernel k) { return k == AttnKernel::AmxBf16; }

std::string attn_kernel_unavailable(AttnKernel k, bool int8, const IsaInfo& i) {
  if (k == AttnKernel::Avx512Bf16 && int8) return "reads only bf16 caches (not kv int8)";
  if (k == AttnKernel::Avx512Vnni && !int8) return "reads only int8 caches (kv int8)";
  uint32_t need = 0;
  switch (k) {
    case AttnKernel::Avx512Bf16: need = kAvx512 | kAvx512Bf16; break;
    case AttnKernel::Avx512Vnni: need = kAvx512 | kAvx512Vnni; break;
    case AttnKernel::Avx512Fma: need = kAvx512; break;
    case AttnKernel::Avx2Fma: need = kAvx2Fma; break;
    case AttnKernel::AmxBf16: need = kAvx512 | kAvx512Bf16 | kAmxBf16; break;
    case AttnKernel::Portable: return "";
  }
  if (i.has(need)) return "";
  std::string why = "needs " + isa_names(need & ~i.usable);
  if ((i.detected & need) == need) why += " (switched off by " + i.cap_source + "=" + i.cap + ")";
  else why += " (not offered by this CPU and OS)";
  return why;
}

AttnKernel attn_kernel_from_name(const std::string& name, const std::string& what, bool int8, const IsaInfo& i) {
  std::string all, runnable;
  for (AttnKernel k : kAttnKernels) {
    all += std::string(all.empty() ? "" : ", ") + attn_kernel_name(k);
    if (attn_kernel_unavailable(k, int8, i).empty())
      runnable += std::string(runnable.empty() ? "" : ", ") + attn_kernel_name(k);
  }
  for (AttnKernel k : kAttnKernels)
    if (name == attn_kernel_name(k)) {
      if (const std::string why = attn_kernel_unavailable(k, int8, i); !why.empty())
        throw Error(ErrorCode::Unsupported, what + ": attention kernel \"" + name + "\" cannot run here: " + why + "; runnable here: " +
                    runnable);
      return k;
    }
  throw Error(ErrorCode::Unsupported, what + ": unknown attention kernel \"" + name + "\"; the attention kernels are " + all +
              " (runnable here: " + runnable + ")");
}

void attend_chunk(AttnKernel kernel, const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                  float* O, float* m, float* l, AttnScratch& sc) {
  const AttnWork w{sc.kptr.data(),  sc.vptr.data(),   sc.s.data(),      sc.p.data(),      sc.v.data(),
                   sc.alpha.data(), sc.lblk.data(),   sc.zero.data(),   sc.qf.data(),     sc.kf.data(),
                   sc.vf.data(),    sc.k8ptr.data(),  sc.v8ptr.data(),  sc.kscale.data(), sc.vscale.data(),
                   sc.qscale.data(), sc.pmax.data(),  sc.q8.data(),     sc.qcorr.data(),  sc.qa.data(),
                   sc.kb.data()};
  switch (kernel) {
    case AttnKernel::Avx512Bf16: attend_chunk_avx512bf16(g, qp, kv, j0, j1, O, m, l, w); break;
    case AttnKernel::Avx512Vnni: attend_chunk_avx512vnni(g, qp, kv, j0, j1, O, m, l, w); break;
    case AttnKernel::Avx512Fma: attend_chunk_avx512fma(g, qp, kv, j0, j1, O, m, l, w); break;
    case AttnKernel::Avx2Fma: attend_chunk_avx2fma(g, qp, kv, j0, j1, O, m, l, w); break;
    case AttnKernel::AmxBf16: attend_chunk_amx(g, qp, kv, j0, j1, O, m, l, w); break;
    case AttnKernel::Portable: attend_chunk_portable(g, qp, kv, j0, j1, O, m, l); break;
  }
}

namespace {

// The timing shape's random data, which the timing and the accuracy check share: bf16 queries, keys and values of unit
// scale (scores of a few units, like a trained model's), `keys` cache rows and T own rows; with int8, the same rows as
// an int8 cache.
struct AttnData {
  AttnGeometry g;
  int n;  // keys + T
  bool int8;
  AlignedBuf<uint32_t> qp;
  AlignedBuf<uint16_t> kc, vc, kown, vown;
  AlignedBuf<uint8_t> k8c, k8o;
  AlignedBuf<int8_t> v8c, v8o;
  AlignedBuf<float> ksc, vsc, kso, vso;
  KeyRows kv;
  AttnData(int d, int group, int T, int keys, bool int8_)
      : g(AttnGeometry::make(d, group, T)), n(keys + T), int8(int8_) {
    uint64_t state = 0x9E3779B97F4A7C15ull;
    auto rnd = [&] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return f32_to_bf16((static_cast<float>(state >> 40) / float(1 << 24) - 0.5f) * 3.f);
    };
    qp.resize(size_t(g.d / 2) * g.qld);
    for (int i = 0; i < g.d / 2; ++i)
      for (int r = 0; r < g.Rp; ++r)
        qp[size_t(i) * g.qld + r] = r < g.R ? uint32_t(rnd()) | uint32_t(rnd()) << 16 : 0u;
    kc.resize(size_t(keys) * d), vc.resize(size_t(keys) * d), kown.resize(size_t(T) * d), vown.resize(size_t(T) * d);
    for (size_t i = 0; i < kc.size(); ++i) kc[i] = rnd(), vc[i] = rnd();
    for (size_t i = 0; i < kown.size(); ++i) kown[i] = rnd(), vown[i] = rnd();
    kv.k_cache = kc.data();
    kv.v_cache = vc.data();
    kv.S = keys;
    kv.k_own = kown.data();
    kv.v_own = vown.data();
    if (int8) {
      k8c.resize(kc.size()), k8o.resize(kown.size()), v8c.resize(vc.size()), v8o.resize(vown.size());
      ksc.resize(keys), vsc.resize(keys), kso.resize(T), vso.resize(T);
      store_int8_rows(kc.data(), vc.data(), keys, d, k8c.data(), v8c.data(), ksc.data(), vsc.data());
      store_int8_rows(kown.data(), vown.data(), T, d, k8o.data(), v8o.data(), kso.data(), vso.data());
      kv.int8 = true;
      kv.i8[0] = {k8c.data(), v8c.data(), ksc.data(), vsc.data()};
      kv.i8[2] = {k8o.data(), v8o.data(), kso.data(), vso.data()};
    }
  }
  AttnData(const AttnData&) = delete;
  AttnData& operator=(const AttnData&) = delete;
  std::string shape() const {
    return "d=" + std::to_string(g.d) + ", " + std::to_string(g.R) + " rows, " + std::to_string(n) + " keys" +
           (int8 ? ", int8 cache" : "");
  }
};

// Kernel k on the whole of data's keys, one chunk: O, m, l.
struct AttnRun {
  AttnScratch sc;
  AlignedBuf<float> O, m, l;
  AttnRun(AttnKernel k, const AttnData& d) : O(size_t(d.g.Rp) * d.g.dp), m(d.g.Rp), l(d.g.Rp) {
    sc.resize(d.g, attn_kernel_is_fp32(k), d.int8, attn_kernel_is_amx(k));
  }
  void run(AttnKernel k, const AttnData& d) {
    init_partial(d.g, O.data(), m.data(), l.data());
    attend_chunk(k, d.g, d.qp.data(), d.kv, 0, d.n, O.data(), m.data(), l.data(), sc);
  }
  // O / l [R][d] and the normalisers l 2^m [R], in double.
  void results(const AttnData& d, std::vector<double>& out, std::vector<double>& norm) const {
    out.resize(size_t(d.g.R) * d.g.d);
    norm.resize(d.g.R);
    for (int r = 0; r < d.g.R; ++r) {
      for (int c = 0; c < d.g.d; ++c) out[size_t(r) * d.g.d + c] = double(O[size_t(r) * d.g.dp + c]) / l[r];
      norm[r] = double(l[r]) * std::exp2(double(m[r]));
    }
  }
};

double time_attention(AttnKernel k, const AttnData& d, double min_seconds) {
  AttnRun run(k, d);
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 1000 && (rep < 2 || total < min_seconds); ++rep) {
    const double t0 = thread_cpu_seconds();
    run.run(k, d);
    const double s = thread_cpu_seconds() - t0;
    if (rep > 0) best = std::min(best, s);  // the first run warms the caches
    total += s;
  }
  return 4.0 * d.g.R * d.n * d.g.d / best * 1e-9;
}

// The accuracy check's yardstick (kernel_check.h): portable's results on the data and the exact reference.
struct AttnYardstick {
  AttnReference ref;
  std::vector<double> out, norm;
};

AttnYardstick attention_yardstick(const AttnData& d) {
  AttnYardstick ys;
  AttnRun p(AttnKernel::Portable, d);
  p.run(AttnKernel::Portable, d);
  p.results(d, ys.out, ys.norm);
  ys.ref = attention_reference(d.g, d.qp.data(), d.kv, d.n);
  return ys;
}

// Runs kernel k once and compares its normalised outputs and normalisers with portable's (with the test-only
// perturbation of op and k on the outputs, if set). fail: the failure for messages, "" when it passes.
KernelAccuracy check_attention(const std::string& op, AttnKernel k, const AttnData& d, const AttnYardstick& ys,
                               std::string* fail) {
  AttnRun run(k, d);
  run.run(k, d);
  std::vector<double> out, norm;
  run.results(d, out, norm);
  if (const double p = kernel_check_perturbation(op, attn_kernel_name(k)); p != 0)
    for (double& v : out) v *= 1 + p;
  const AttnBound b = attention_bound(ys.ref, k);
  const KernelAccuracy ao = kernel_accuracy(out.data(), ys.out.data(), b.out.data(), out.size());
  const KernelAccuracy an = kernel_accuracy(norm.data(), ys.norm.data(), b.norm.data(), norm.size());
  const bool on_norm = an.ratio > ao.ratio;
  const KernelAccuracy a = on_norm ? an : ao;
  fail->clear();
  if (!a.ok())
    *fail = accuracy_failure(attn_kernel_name(k), a,
                             on_norm ? "the normaliser l 2^m of row " + std::to_string(a.index)
                                     : "output (" + std::to_string(a.index / d.g.d) + ", " +
                                           std::to_string(a.index % d.g.d) + ")",
                             "portable", d.shape());
  return a;
}

}  // namespace

double time_attention_kernel(AttnKernel k, int d, int group, int T, int keys, double min_seconds, bool int8) {
  const AttnData data(d, group, T, keys, int8);
  return time_attention(k, data, min_seconds);
}

namespace {

AttnKernel attn_kernel_named(const std::string& name) {
  for (AttnKernel k : kAttnKernels)
    if (name == attn_kernel_name(k)) return k;
  return AttnKernel::Portable;
}

// The attention candidates' timing data (built at the first check) and its yardstick; the portable kernel alone is
// timed on 128 keys (forced: the check's reference needs no data).
class AttnBench final : public KernelBench {
 public:
  AttnBench(std::string op, int d, int group, int T, int keys, bool int8)
      : op_(std::move(op)), d_(d), group_(group), T_(T), keys_(keys), int8_(int8) {}
  std::string shape() const override { return data().shape(); }
  KernelAccuracy check(const std::string& name, std::string* fail) override {
    if (!ys_) ys_ = std::make_unique<AttnYardstick>(attention_yardstick(data()));
    return check_attention(op_, attn_kernel_named(name), data(), *ys_, fail);
  }
  double rate(const std::string& name, bool lone) override {
    const AttnKernel k = attn_kernel_named(name);
    if (k == AttnKernel::Portable) return time_attention_kernel(k, d_, group_, T_, 128, 0.02, int8_);
    // About 40 ms per kernel on one thread (the ratios between kernels are those of the full pool).
    return time_attention(k, data(), lone ? 0.02 : 0.04);
  }

 private:
  const AttnData& data() const {
    if (!data_) data_ = std::make_unique<AttnData>(d_, group_, T_, keys_, int8_);
    return *data_;
  }
  std::string op_;
  int d_, group_, T_, keys_;
  bool int8_;
  mutable std::unique_ptr<AttnData> data_;
  std::unique_ptr<AttnYardstick> ys_;
};

}  // namespace

AttnKernel select_attention_kernel(int d, int group, int T, int keys, bool int8, const KernelScope& scope,
                                   KernelChoices* made) {
  KernelOp op;
  // Op "attention" (bf16 caches) or "attention_kv_int8"; attention=NAME forces both, unless attention_kv_int8=NAME
  // forces the int8 cache's.
  op.op = int8 ? "attention_kv_int8" : "attention";
  op.fallback_op = int8 ? "attention" : "";
  op.yardstick = "portable";
  // The portable kernel runs only where no vectorised one can (it is never faster) or none passes the check.
  for (AttnKernel k : kAttnKernels)
    op.candidates.push_back(
        {attn_kernel_name(k), attn_kernel_instruction(k), attn_kernel_unavailable(k, int8, scope.isa)});
  op.cache_key = std::to_string(d) + "," + std::to_string(group) + "," + std::to_string(T) + "," +
                 std::to_string(keys) + (int8 ? ",int8" : "");
  op.isa_key = scope.isa.usable;
  op.bench = [=, name = op.op] { return std::make_unique<AttnBench>(name, d, group, T, keys, int8); };
  op.time_lone = true;
  op.lone_why = "the only vectorised kernel runnable here";
  op.none_why = "the only kernel this CPU can run (no AVX2 + FMA)";
  op.refuse = [&](const std::string& name, const std::string&, const std::string& src) {
    attn_kernel_from_name(name, src, int8, scope.isa);  // throws, naming the candidates
  };
  const KernelChoice c = choose_kernel(op, scope);
  if (made) record_kernel_choice(*made, c);
  return attn_kernel_named(c.kernel);
}

// Same math as the AVX-512 path (bf16 operands, fp32 accumulation, base-2 online softmax with bf16
// probabilities), one key at a time. For CPUs without AVX512-BF16. An int8 cache's rows are widened to q * s.
namespace {

inline const uint16_t* mapped_row(const RowMap& m, int64_t i) {
  const int64_t r = m.row0 + i;
  if (!m.pages) return m.base + r * m.stride;
  return m.base + m.pages[r >> m.page_shift] * m.page_stride + (r & ((int64_t(1) << m.page_shift) - 1)) * m.stride;
}

// Rows [i0, i1) of a mapped segment prefetched into L2. The kernels stream the next block of a segment that is one
// run of rows themselves; rows at strides or on pages are fetched here, a block ahead, so that they do not come
// cold from memory one demand miss at a time.
void prefetch_rows(const RowMap& m, int64_t i0, int64_t i1, int d) {
  for (int64_t i = i0; i < i1; ++i) {
    const char* p = reinterpret_cast<const char*>(mapped_row(m, i));
    for (int b = 0; b < d * 2; b += 64) __builtin_prefetch(p + b, 0, 2);
  }
}

}  // namespace

void key_row_ptrs(const KeyRows& kv, int d, int jb, int n, int npad, const uint16_t* zero, const uint16_t** kptr,
                  const uint16_t** vptr) {
  for (int k = 0; k < npad; ++k) {
    const int j = jb + k;
    if (k >= n) {
      kptr[k] = vptr[k] = zero;
    } else if (j < kv.S) {
      kptr[k] = kv.k_map.base ? mapped_row(kv.k_map, j) : kv.k_cache + size_t(j) * d;
      vptr[k] = kv.v_map.base ? mapped_row(kv.v_map, j) : kv.v_cache + size_t(j) * d;
    } else if (j < kv.S + kv.S2) {
      kptr[k] = kv.k_mid_map.base ? mapped_row(kv.k_mid_map, j - kv.S) : kv.k_mid + size_t(j - kv.S) * d;
      vptr[k] = kv.v_mid_map.base ? mapped_row(kv.v_mid_map, j - kv.S) : kv.v_mid + size_t(j - kv.S) * d;
    } else {
      kptr[k] = kv.k_own + size_t(j - kv.S - kv.S2) * d;
      vptr[k] = kv.v_own + size_t(j - kv.S - kv.S2) * d;
    }
  }
  // The next block's mapped rows (results do not depend on it).
  const int next0 = jb + n, next1 = next0 + kKeyBlock;
  if (kv.k_map.base && next0 < kv.S) {
    prefetch_rows(kv.k_map, next0, std::min(next1, kv.S), d);
    prefetch_rows(kv.v_map, next0, std::min(next1, kv.S), d);
  }
  if (kv.k_mid_map.base && next1 > kv.S && next0 < kv.S + kv.S2) {
    const int a = std::max(next0, kv.S) - kv.S, b = std::min(next1, kv.S + kv.S2) - kv.S;
    prefetch_rows(kv.k_mid_map, a, b, d);
    prefetch_rows(kv.v_mid_map, a, b, d);
  }
}

void attend_chunk_portable(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                           float* O, float* m, float* l) {
  const int d = g.d, half = d / 2;
  std::vector<float> q(d), krow(d), vrow(d);
  for (int r = 0; r < g.R; ++r) {
    for (int i = 0; i < half; ++i) {
      const uint32_t pair = qp[size_t(i) * g.qld + r];
      q[2 * i] = bf16_to_f32(static_cast<uint16_t>(pair & 0xffff));
      q[2 * i + 1] = bf16_to_f32(static_cast<uint16_t>(pair >> 16));
    }
    float* o = O + size_t(r) * g.dp;
    for (int j = j0; j < j1; ++j) {
      if (kv.int8) {
        const int seg = j < kv.S ? 0 : j < kv.S + kv.S2 ? 1 : 2;
        const size_t i = size_t(j - (seg == 0 ? 0 : seg == 1 ? kv.S : kv.S + kv.S2));
        const KeyRows::Int8Segment& sg = kv.i8[seg];
        for (int c = 0; c < d; ++c)
          krow[c] = float(int(sg.k[i * d + c]) - 128) * sg.ks[i], vrow[c] = float(sg.v[i * d + c]) * sg.vs[i];
      } else {
        const uint16_t *kr, *vr;
        key_row_ptrs(kv, d, j, 1, 1, nullptr, &kr, &vr);
        for (int c = 0; c < d; ++c) krow[c] = bf16_to_f32(kr[c]), vrow[c] = bf16_to_f32(vr[c]);
      }
      float s = 0.f;
      for (int c = 0; c < d; ++c) s += q[c] * krow[c];
      s *= g.scale_log2;
      const float m_new = std::max(m[r], s);
      const float alpha = std::exp2(m[r] - m_new), p = std::exp2(s - m_new);
      const float pb = bf16_round(p);
      for (int c = 0; c < d; ++c) o[c] = o[c] * alpha + pb * vrow[c];
      l[r] = l[r] * alpha + p;
      m[r] = m_new;
    }
  }
}

void merge_partials(const AttnGeometry& g, int n, const float* const* O, const float* const* m,
                    const float* const* l, int T, int group, int head0, int ld, float* out_f32, uint16_t* out_bf16) {
  std::vector<float> w(n), acc(g.d);
  for (int r = 0; r < g.R; ++r) {
    float mx = -INFINITY;
    for (int c = 0; c < n; ++c) mx = std::max(mx, m[c][r]);
    float denom = 0.f;
    for (int c = 0; c < n; ++c) {
      const float mc = m[c][r];
      w[c] = mc == -INFINITY ? 0.f : std::exp2(mc - mx);
      denom += w[c] * l[c][r];
    }
    const float inv = denom > 0.f ? 1.f / denom : 0.f;
    const float* o0 = O[0] + size_t(r) * g.dp;
    const float w0 = w[0] * inv;
#pragma omp simd
    for (int i = 0; i < g.d; ++i) acc[i] = w0 * o0[i];
    for (int c = 1; c < n; ++c) {
      const float* o = O[c] + size_t(r) * g.dp;
      const float wc = w[c] * inv;
#pragma omp simd
      for (int i = 0; i < g.d; ++i) acc[i] += wc * o[i];
    }
    const int hh = r / T, t = r % T;
    const size_t off = size_t(t) * ld + size_t(head0 + hh) * g.d;
    if (out_f32) std::copy(acc.begin(), acc.end(), out_f32 + off);
    if (out_bf16) store_bf16(acc.data(), g.d, out_bf16 + off);
  }
}

void merge_partials(const AttnGeometry& g, int n, const float* O, const float* m, const float* l, int T,
                    int group, int head0, int ld, float* out_f32, uint16_t* out_bf16) {
  const size_t ostride = size_t(g.Rp) * g.dp;
  std::vector<const float*> op(n), mp(n), lp(n);
  for (int c = 0; c < n; ++c) {
    op[c] = O + c * ostride;
    mp[c] = m + size_t(c) * g.Rp;
    lp[c] = l + size_t(c) * g.Rp;
  }
  merge_partials(g, n, op.data(), mp.data(), lp.data(), T, group, head0, ld, out_f32, out_bf16);
}

}  // namespace alpamayo::cpu
