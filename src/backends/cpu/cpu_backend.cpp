// CpuModel (weight packing) and CpuSession construction and binding.
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/cpu_backend_impl.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/kernel_check.h"
#include "backends/cpu/kernel_registry.h"
#include "backends/cpu/attention/kv_quant.h"
#include "backends/cpu/profile/peaks.h"

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


// The kernel for the weights' matmuls, op "matmul_bf16" (bf16 weights) or "matmul_int8" (int8 weights): oneDNN
// (OnednnLinear) or the fp32-FMA and dot-product kernels (matmul_kernels.h), chosen by choose_kernel
// (kernel_registry.h) on an M x K x N slice.
constexpr const char* kOnednn = "onednn";

// Empty when the candidate runs here, else why not.
// k_model: the model's largest K (avx512_vnni's int32 sums must not overflow).
std::string matmul_unrunnable(const std::string& name, WeightType t, OnednnPrimitives& kernels, int M, int K, int N,
                              int k_model, const IsaInfo& i) {
  if (name == kOnednn) {
    if (std::string why = onednn_within_cap(i); !why.empty()) return why;
    try {
      kernels.get(t, M, K, N, N);
    } catch (const Error& e) {
      return e.what();
    }
    return t == WeightType::INT8 ? onednn_int8_refused(i) : "";
  }
  MatmulKernel k;
  if (!matmul_kernel_from_name(name, &k)) return "unknown kernel";
  if (std::string why = matmul_kernel_refuses(k, t == WeightType::INT8, k_model); !why.empty()) return why;
  return matmul_kernel_unavailable(k, i);
}

// The timing shape's random data, which the timing and the accuracy check share: W [N][K] and activations x [M][K]
// ~ N(0, 0.05), x as bf16 (bf16 weights) or quantised per row as the step does (int8: u8 = q + 128, row scales rs).
struct MatmulData {
  WeightType t;
  int M, K, N;
  std::vector<float> W;
  AlignedBuf<uint16_t> xb;
  AlignedBuf<uint8_t> xq;
  std::vector<float> rs;
  MatmulData(WeightType t_, int M_, int K_, int N_) : t(t_), M(M_), K(K_), N(N_), W(size_t(N_) * K_) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 0.05f);
    for (float& v : W) v = nd(rng);
    std::vector<float> x(size_t(M) * K);
    for (float& v : x) v = nd(rng);
    if (t == WeightType::BF16) {
      xb.resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    } else {
      xq.resize(x.size());
      rs.resize(M);
      quantize_rows(x.data(), 0, M, K, xq.data(), rs.data());
    }
  }
  const void* x() const { return t == WeightType::BF16 ? static_cast<const void*>(xb.data()) : xq.data(); }
};

// Candidate `name` packed with d's weights: run() multiplies d's x (what the timing times), output() is the last
// result after the step's epilogue (int8: (y - corr) * (cs * rs), copy_rows), what the accuracy check compares.
class MatmulRun {
 public:
  MatmulRun(const std::string& name, const MatmulData& d, OnednnPrimitives& kernels)
      : d_(d), onednn_(name == kOnednn), st_(kernels.engine()), y_(size_t(d.M) * d.N) {
    if (onednn_) {
      lin_.pack(kernels, d.t, d.K, d.N, d.W.data(), d.M, d.N);
      plan_ = lin_.plan(kernels, d.M, d.N);
      scratch_.resize(plan_.scratch_bytes() + 1);
    } else {
      MatmulKernel k = MatmulKernel::Portable;
      matmul_kernel_from_name(name, &k);
      if (d.t == WeightType::INT8) fw_.pack_int8(k, d.W.data(), d.K, d.N);
      else fw_.pack(k, d.W.data(), d.K, d.N);
      scratch_.resize(matmul_scratch_bytes(k, d.M, d.K));
    }
  }
  void run() {
    if (onednn_) lin_.run(st_, plan_, d_.x(), y_.data(), scratch_.data());
    else run_matmul(fw_, d_.x(), d_.M, d_.K, y_.data(), d_.N, scratch_.data());
  }
  std::vector<float> output() {
    st_.wait();
    std::vector<float> out(y_.size());
    const bool int8 = d_.t == WeightType::INT8;
    copy_rows(out.data(), d_.N, y_.data(), d_.M, d_.N, int8 ? d_.rs.data() : nullptr,
              onednn_ ? lin_.col_correction() : fw_.col_correction(), onednn_ ? lin_.col_scale() : fw_.col_scale());
    return out;
  }

 private:
  const MatmulData& d_;
  bool onednn_;
  dnnl::stream st_;
  AlignedBuf<float> y_;
  OnednnLinear lin_;
  OnednnPlan plan_;
  MatmulWeights fw_;
  AlignedBuf<uint8_t> scratch_;
};

// Seconds per call (the best of a few, after a warm-up; thread CPU time, isa.h).
double time_matmul(MatmulRun& r) {
  r.run();
  double best = 1e30, total = 0;
  for (int i = 0; i < 10 && total < 0.05; ++i) {
    const double t0 = thread_cpu_seconds();
    r.run();
    const double sec = thread_cpu_seconds() - t0;
    best = std::min(best, sec);
    total += sec;
  }
  return best;
}

// The accuracy check's yardstick on d (kernel_check.h): portable_fma's output and what the bounds need.
struct MatmulYardstick {
  std::string shape;  // "64 x 1536 x 1024"
  std::vector<float> y;
  std::vector<double> bf16_bound;  // bf16: the bound of every candidate
  Int8Sums sums;                   // int8: the exact sums, and the weights' scales
  std::vector<float> ws;
};

MatmulYardstick matmul_yardstick(const MatmulData& d, OnednnPrimitives& kernels) {
  MatmulYardstick ys;
  ys.shape = std::to_string(d.M) + " x " + std::to_string(d.K) + " x " + std::to_string(d.N);
  MatmulRun p("portable_fma", d, kernels);
  p.run();
  ys.y = p.output();
  if (d.t == WeightType::BF16) {
    std::vector<uint16_t> wb(d.W.size());
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = f32_to_bf16(d.W[i]);
    ys.bf16_bound = matmul_bf16_bound(d.xb.data(), wb.data(), d.M, d.K, d.N);
  } else {
    std::vector<int8_t> wq(d.W.size());
    ys.ws.resize(d.N);
    quantize_weight_rows(d.W.data(), d.K, d.N, wq.data(), ys.ws.data(), nullptr);
    ys.sums = int8_sums(d.xq.data(), wq.data(), d.M, d.K, d.N);
  }
  return ys;
}

// Runs candidate r once and compares its output with the yardstick's (with the test-only perturbation of op and name,
// if set). why: the failure for messages, "" when it passes.
KernelAccuracy check_matmul(const std::string& op, const std::string& name, MatmulRun& r, const MatmulData& d,
                            const MatmulYardstick& ys, std::string* why) {
  r.run();
  std::vector<float> y = r.output();
  if (const double p = kernel_check_perturbation(op, name); p != 0)
    for (float& v : y) v = static_cast<float>(v * (1 + p));
  const std::vector<double> b = d.t == WeightType::BF16
                                    ? ys.bf16_bound
                                    : matmul_int8_bound(ys.sums, d.rs.data(), ys.ws.data(), int8_sum_of(name));
  const KernelAccuracy a = kernel_accuracy(y.data(), ys.y.data(), b.data(), y.size());
  why->clear();
  if (!a.ok()) {
    const std::string at = "output (" + std::to_string(a.index / d.N) + ", " + std::to_string(a.index % d.N) + ")";
    *why = accuracy_failure(name, a, at, "portable_fma", ys.shape);
  }
  return a;
}

// The matmul candidates' timing data: the accuracy check's yardstick once, then each candidate packed in turn
// (the one checked last is the one timed).
class MatmulBench final : public KernelBench {
 public:
  MatmulBench(std::string op, WeightType t, int M, int K, int N, OnednnPrimitives& kernels)
      : op_(std::move(op)), d_(t, M, K, N), kernels_(kernels), ys_(matmul_yardstick(d_, kernels)) {}
  std::string shape() const override { return ys_.shape; }
  KernelAccuracy check(const std::string& name, std::string* fail) override {
    return check_matmul(op_, name, run_of(name), d_, ys_, fail);
  }
  double rate(const std::string& name, bool) override {
    return 2.0 * d_.M * d_.K * d_.N / time_matmul(run_of(name)) / 1e9;
  }

 private:
  MatmulRun& run_of(const std::string& name) {
    if (!run_ || name_ != name) run_ = std::make_unique<MatmulRun>(name, d_, kernels_), name_ = name;
    return *run_;
  }
  std::string op_;
  MatmulData d_;
  OnednnPrimitives& kernels_;
  MatmulYardstick ys_;
  std::unique_ptr<MatmulRun> run_;
  std::string name_;
};

KernelOp matmul_op(WeightType t, OnednnPrimitives& kernels, int M, int K, int N, int k_model, const IsaInfo& isa) {
  KernelOp op;
  op.op = t == WeightType::INT8 ? "matmul_int8" : "matmul_bf16";
  op.yardstick = "portable_fma";
  op.unit = t == WeightType::INT8 ? "GOP/s" : "GFLOP/s";
  // Our dot-product kernels (avx512_vnni and avx2_int8 for int8, avx512_bf16 for bf16) before oneDNN. Inside a
  // full-size step they ran 2-3% (int8) and 2-7% (bf16) faster, with less peak memory (bench_step, AMD EPYC Zen 5),
  // which the warm timing shape barely shows; oneDNN must be 25% faster there to be taken instead, as with AMX.
  // amx_bf16 before oneDNN, by a rule this slice cannot show: with the weights streamed from memory, as a
  // full-size step streams them, amx_bf16 ran the bf16 matmuls faster than oneDNN's AMX brgemm, while on this warm
  // slice oneDNN is up to 1.2x faster; so oneDNN is taken only where it is 25% faster here (docs/CPU_BACKEND.md,
  // "AMX bf16 matmul"). The order matters only where AMX-BF16 is granted: elsewhere amx_bf16 cannot run.
  // amx_int8 sits there too, for int8 where AMX-INT8 is granted ("AMX int8 matmul").
  for (MatmulKernel k : kMatmulKernels) {
    if (k == MatmulKernel::Avx512)  // after the dot-product and AMX kernels, before the FMA ones
      op.candidates.push_back({kOnednn, "", matmul_unrunnable(kOnednn, t, kernels, M, K, N, k_model, isa)});
    const std::string name = matmul_kernel_name(k);
    op.candidates.push_back(
        {name, matmul_kernel_instruction(k), matmul_unrunnable(name, t, kernels, M, K, N, k_model, isa)});
  }
  // k_model matters only through the int8 dot kernels' bounds on K.
  op.cache_key = std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N) + " k" +
                 std::to_string(int(k_model > kVnniMaxK) + int(k_model > kAvx2Int8MaxK));
  op.isa_key = isa.usable | (onednn_within_cap(isa).empty() ? 0x80000000u : 0u);
  op.bench = [=, &kernels, op_name = op.op] { return std::make_unique<MatmulBench>(op_name, t, M, K, N, kernels); };
  return op;
}

}  // namespace

KernelChoice select_matmul_kernel(WeightType t, OnednnPrimitives& kernels, int k_model, const KernelScope& scope) {
  ScopedOmpThreads one(1);  // timed as it runs: single-threaded on one pool thread
  // 64 x 1536 x 1024: the seed's M and K, 1024 of its gate/up columns.
  return choose_kernel(matmul_op(t, kernels, kRepTokens, kRepModelDim, 1024, k_model, scope.isa), scope);
}

KernelScope kernel_scope(const BackendOptions& o) {
  const std::string src = o.kernels_source.empty() ? "kernels" : o.kernels_source;
  return {isa_with_cap(o.isa_cap, o.isa_cap_source.empty() ? "isa_cap" : o.isa_cap_source), o.kernels, src};
}

KernelChoice select_matmul_kernel(WeightType t, int k_model, const KernelScope& scope) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  OnednnPrimitives kernels(eng);
  return select_matmul_kernel(t, kernels, k_model, scope);
}

namespace {

// t in fp32, in buf (grown as needed, kept by the caller from layer to layer: fresh 40 MB buffers per matrix
// spent a fifth of a full-size model's packing time in page faults).
const float* as_f32(const TensorView& t, std::vector<float>& buf) {
  if (buf.size() < size_t(t.numel())) buf.resize(size_t(t.numel()));
  convert_to_f32(t, buf.data());
  return buf.data();
}

// Chunks per thread of a linear layer on our kernels (FmaLinear): the phase ends about half a chunk after the
// last thread's work runs out, so more chunks bound the loss to a thread held back more tightly; each chunk is
// still a run of whole panels (16 or 64 columns) with its own prologue. Where a kernel gains from wider calls
// (amx_bf16 at many rows), the session runs several consecutive chunks per call (CpuSession::run_chunks), so the
// packing stays independent of the rows. Measured: docs/PERFORMANCE.md.
constexpr int kChunksPerThread = 8;

// Thread slice s in up to `chunks` runs of whole panels of width w (the last run ends at s.n1).
std::vector<Slice> chunk_slice(Slice s, int w, int chunks) {
  std::vector<Slice> out;
  const int panels = (s.n1 - s.n0 + w - 1) / w, n = std::min(chunks, panels);
  for (int c = 0; c < n; ++c)
    out.push_back({s.n0 + panels * c / n * w, std::min(s.n1, s.n0 + panels * (c + 1) / n * w)});
  return out;
}

}  // namespace

const char* FmaLinear::thread_data(int t) const {
  return first[t] < first[t + 1] ? reinterpret_cast<const char*>(chunks[first[t]].data()) : nullptr;
}

size_t FmaLinear::thread_bytes(int t) const {
  if (first[t] >= first[t + 1]) return 0;
  const MatmulWeights& last = chunks[first[t + 1] - 1];
  return size_t(reinterpret_cast<const char*>(last.data()) - thread_data(t)) + last.bytes();
}

void CpuModel::pack_layer(const LayerWeights& lw, CpuLayer& out, PackScratch& sc) {
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

  if (sc.a.size() < size_t(Nqkv) * D) sc.a.resize(size_t(Nqkv) * D);
  float* qkv = sc.a.data();
  convert_to_f32(lw.q, qkv);
  convert_to_f32(lw.k, qkv + size_t(Hq) * d * D);
  convert_to_f32(lw.v, qkv + size_t(Hq + Hkv) * d * D);
  if (wf_.is_block()) {
    pack_layer_blocks(qkv, lw, out, sc);  // qkv lies in sc.a
    return;
  }
  // One thread's slice in oneDNN's layout, or its chunks in our kernel's panels (only the chosen kernel's copy).
  // rows(s) gives the rows of columns s, [n, K]; gated (gate_up): a slice or chunk holds gate rows [n0, n1) then
  // up rows [n0, n1), so that SiLU*up stays with the thread that computed them.
  auto pack = [&](std::vector<OnednnLinear>& lin, FmaLinear& fl, const std::vector<Slice>& slices, int K,
                  const std::function<const float*(Slice)>& rows, bool gated) {
    const int f = gated ? 2 : 1;
    if (!use_fma_) {
      for (int t = 0; t < nthreads_; ++t)
        if (const Slice s = slices[t]; s.n1 > s.n0) {
          const int n = f * (s.n1 - s.n0);
          lin[t].pack(*kernels_, wtype_, K, n, rows(s), Mhint, n);
        }
      return;
    }
    const bool i8 = wtype_ == WeightType::INT8;
    const int chunks = nthreads_ > 1 ? kChunksPerThread : 1;  // one thread has nobody to take chunks from
    fl.first.assign(1, 0);
    for (int t = 0; t < nthreads_; ++t) {
      const std::vector<Slice> cs = chunk_slice(slices[t], matmul_panel_width(fma_kernel_), chunks);
      size_t bytes = 0;
      for (const Slice c : cs) bytes += MatmulWeights::packed_bytes(fma_kernel_, i8, K, f * (c.n1 - c.n0));
      MatmulArena arena(bytes);
      for (const Slice c : cs) {
        MatmulWeights& w = fl.chunks.emplace_back();
        if (i8) w.pack_int8(fma_kernel_, rows(c), K, f * (c.n1 - c.n0), &arena);
        else w.pack(fma_kernel_, rows(c), K, f * (c.n1 - c.n0), &arena);
        fl.cols.push_back(c);
      }
      fl.first.push_back(static_cast<int>(fl.chunks.size()));
    }
  };
  pack(out.qkv, out.fqkv, qkv_slices_, D, [&](Slice s) { return qkv + size_t(s.n0) * D; }, false);
  const float* o = as_f32(lw.o, sc.a);
  pack(out.o, out.fo, o_slices_, Hq * d, [&](Slice s) { return o + size_t(s.n0) * Hq * d; }, false);
  {
    const float* gate = as_f32(lw.gate, sc.a);
    const float* up = as_f32(lw.up, sc.b);
    pack(out.gate_up, out.fgate_up, mlp_slices_, D, [&](Slice s) {
      const size_t n = s.n1 - s.n0;
      if (sc.c.size() < 2 * n * D) sc.c.resize(2 * n * D);
      std::copy(gate + size_t(s.n0) * D, gate + size_t(s.n1) * D, sc.c.begin());
      std::copy(up + size_t(s.n0) * D, up + size_t(s.n1) * D, sc.c.begin() + n * D);
      return static_cast<const float*>(sc.c.data());
    }, true);
  }
  const float* down = as_f32(lw.down, sc.a);
  pack(out.down, out.fdown, down_slices_, I, [&](Slice s) { return down + size_t(s.n0) * I; }, false);
}

// Block formats: each thread's column slices stored as the device holds them (bfp_matmul.h); slices start at
// multiples of 64 columns, so their blocks and tiles are those of the whole matrix (weight_formats.h).
void CpuModel::pack_layer_blocks(const float* qkv, const LayerWeights& lw, CpuLayer& out, PackScratch& sc) {
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
  pack(out.bqkv, qkv_slices_, LinearKind::QKV, qkv, D);
  pack(out.bo, o_slices_, LinearKind::O, as_f32(lw.o, sc.b), Hq * d);
  pack(out.bgate_up, mlp_slices_, LinearKind::Gate, as_f32(lw.gate, sc.b), D);
  pack(out.bgate_up, mlp_slices_, LinearKind::Up, as_f32(lw.up, sc.b), D);
  pack(out.bdown, down_slices_, LinearKind::Down, as_f32(lw.down, sc.b), I);
}

CpuModel::CpuModel(const ExpertConfig& cfg, const ModelWeights& w, const BackendOptions& opts)
    : scope_(kernel_scope(opts)),
      opts_(opts),
      wf_(parse_weight_format(opts)),
      wtype_(parse_weights(opts.weights)),
      nthreads_(resolve_threads(opts.threads)),
      cfg_(cfg),
      eng_(dnnl::engine::kind::cpu, 0),
      kernels_(std::make_unique<OnednnPrimitives>(eng_)),
      proj_(cfg, w, opts.exact_freqs) {
  const int D = cfg.D, Hq = cfg.Hq, Hkv = cfg.Hkv, d = cfg.d, I = cfg.I;
  qkv_slices_ = split_cols((Hq + 2 * Hkv) * d, nthreads_);
  o_slices_ = split_cols(D, nthreads_);
  mlp_slices_ = split_cols(I, nthreads_);
  down_slices_ = o_slices_;
  layers_.assign(cfg.L, {});
  final_norm_ = to_f32(w.expert.final_norm);
  // Kernels are timed on one fixed representative shape (the seed's head and layer sizes), not the model's:
  // the choice, and with it the rounding, then depends on the machine only, never on the model's sizes or
  // the thread count, and a tiny model (where overheads decide) picks what a full-size one does.
  kv_int8_ = opts.kv == "int8";  // Model::load checked the format against cpu_backend_info()
  attn_kernel_ = select_attention_kernel(kRepHeadDim, kRepGroup, kRepTokens, 2048, kv_int8_, scope_, &choices_);
  // Packing runs on a temporary pool; each session has its own.
  ThreadPool pool(nthreads_);
  ScopedOmpThreads one(1);  // oneDNN kernels are planned and run single-threaded per pool thread
  if (!wf_.is_block()) {
    const KernelChoice c = select_matmul_kernel(wtype_, *kernels_, std::max({D, Hq * d, cfg.I}), scope_);
    record_kernel_choice(choices_, c);
    matmul_kernel_ = c.kernel;
    use_fma_ = matmul_kernel_from_name(matmul_kernel_, &fma_kernel_);  // else onednn
  }
  pool.run([&](int tid) {
    ScopedOmpThreads one_here(1);
    PackScratch sc;
    for (int l = tid; l < cfg.L; l += nthreads_) pack_layer(w.expert.layers[l], layers_[l], sc);
  });
}

std::string CpuModel::kernels() const {
  std::string k = std::string(kv_int8_ ? "attention_kv_int8=" : "attention=") + attn_kernel_name(attn_kernel_);
  if (!matmul_kernel_.empty())
    k += std::string(wtype_ == WeightType::INT8 ? ",matmul_int8=" : ",matmul_bf16=") + matmul_kernel_;
  return k;
}

size_t CpuModel::weight_bytes() const {
  size_t n = final_norm_.size() * sizeof(float);
  for (const CpuLayer& layer : layers_) {
    n += (layer.input_norm.size() + layer.post_norm.size() + layer.q_norm.size() + layer.k_norm.size()) * sizeof(float);
    for (const auto* list : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down})
      for (const OnednnLinear& p : *list) n += p.packed_bytes() + (p.col_scale() ? 2 * sizeof(float) * p.N() : 0);
    for (const auto* list : {&layer.bqkv, &layer.bo, &layer.bgate_up, &layer.bdown})
      for (const BlockLinear& b : *list) n += b.bytes();
    for (const auto* list : {&layer.fqkv, &layer.fo, &layer.fgate_up, &layer.fdown})
      for (const MatmulWeights& f : list->chunks) n += f.bytes() + (f.col_scale() ? 2 * sizeof(float) * f.N() : 0);
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
      pool_(nthreads_),
      queues_(std::make_unique<StealQueue[]>(size_t(kLins) * nthreads_)) {
  for (int t = 0; t < nthreads_; ++t) streams_.emplace_back(m.eng_);
  per_thread_.resize(nthreads_);
}

// A bf16 view that is not dense row-major is read in place through its strides (and page table): *map gets them and
// the result is null. Another dtype is converted into an owned buffer, a strided or paged view's attended rows
// through kv_row_offset into a dense [N, Hkv, rows, d] one.
const uint16_t* CpuSession::cache_as_bf16(const KVCache& kv, const TensorView& t, bool suffix, CacheMap& map) {
  const bool dense = !kv.paged() && t.is_contiguous();
  if (t.dtype == DType::BF16 && dense) return static_cast<const uint16_t*>(t.data);
  if (t.dtype == DType::BF16) {
    const int64_t c3 = t.shape[3], c2 = t.shape[2] * c3;
    map = {static_cast<const uint16_t*>(t.data), t.strides.empty() ? t.shape[1] * c2 : t.strides[0],
           t.strides.empty() ? c2 : t.strides[1], t.strides.empty() ? c3 : t.strides[2]};
    return nullptr;
  }
  const int N = suffix ? kv.B : kv.G, R = suffix ? kv.Q : kv.P;
  owned_cache_.emplace_back(dense ? size_t(t.numel()) : size_t(N) * kv.Hkv * R * kv.d);
  uint16_t* out = owned_cache_.back().data();
  if (dense) {
    convert_to_bf16(t, out);
    return out;
  }
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < kv.Hkv; ++h)
      for (int64_t i = suffix ? 0 : kv.pad(n); i < (suffix ? kv.suffix(n) : kv.valid_len[n]); ++i)
        convert_to_bf16(kv_row_view(kv, t, suffix, n, h, i), out + ((size_t(n) * kv.Hkv + h) * R + i) * kv.d);
  return out;
}

// One function on purpose (about 120 lines): every buffer of a bind is sized and every cache view resolved here,
// in one pass over the binding, so that what the step reads is all set before the first step runs.
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

  // KV caches: used in place when bf16, otherwise converted once here (or quantised: int8).
  owned_cache_.clear();
  if (m_.kv_int8_) quantise_cache(kv);
  k_cache_.assign(L, nullptr);
  v_cache_.assign(L, nullptr);
  ks_cache_.assign(kv.suffix_key.empty() ? 0 : L, nullptr);
  vs_cache_.assign(ks_cache_.size(), nullptr);
  k_map_.assign(L, {});
  v_map_.assign(L, {});
  ks_map_.assign(ks_cache_.size(), {});
  vs_map_.assign(ks_cache_.size(), {});
  for (int l = 0; l < L && !m_.kv_int8_; ++l) {
    k_cache_[l] = cache_as_bf16(kv, kv.key[l], false, k_map_[l]);
    v_cache_[l] = cache_as_bf16(kv, kv.value[l], false, v_map_[l]);
    if (!ks_cache_.empty()) {
      ks_cache_[l] = cache_as_bf16(kv, kv.suffix_key[l], true, ks_map_[l]);
      vs_cache_[l] = cache_as_bf16(kv, kv.suffix_value[l], true, vs_map_[l]);
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
    OnednnPrimitives& kernels = *m_.kernels_;
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
  k_own_.resize(m_.kv_int8_ ? 0 : size_t(B_) * Hkv * T_ * d);
  v_own_.resize(m_.kv_int8_ ? 0 : size_t(B_) * Hkv * T_ * d);
  if (m_.kv_int8_) i8_own_.ensure(size_t(B_) * Hkv * T_, d);
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
      for (const OnednnLinear* lin : {&layer.qkv[t], &layer.o[t], &layer.gate_up[t], &layer.down[t]})
        tmp = std::max(tmp, size_t(M_) * lin->N());
      for (const OnednnPlan* mp : {&p.qkv, &p.o, &p.gate_up, &p.down}) scratch = std::max(scratch, mp->scratch_bytes());
      if (m_.use_fma_) {  // any thread may run any chunk
        for (const FmaLinear* fl : {&layer.fqkv, &layer.fo, &layer.fgate_up, &layer.fdown})
          for (const MatmulWeights& fw : fl->chunks)
            if (fw.N()) {
              // A run of chunks (run_chunks) holds up to matmul_many_columns() columns before its last one.
              tmp = std::max(tmp, size_t(M_) * (fw.N() + matmul_many_columns(fw.kernel(), M_)));
              scratch = std::max(scratch, matmul_scratch_bytes(fw.kernel(), M_, fw.K()));
            }
      }
      if (m_.wf_.is_block()) {
        for (const BlockLinear* lin : {&layer.bqkv[t], &layer.bo[t], &layer.bgate_up[t], &layer.bdown[t]})
          tmp = std::max(tmp, size_t(M_) * lin->N());
        scratch = std::max(scratch, block_scratch_bytes());
      }
    }
    pt.tmp.resize(tmp);
    pt.scratch.resize(scratch);
    pt.row.resize(std::max({D, I, d}));
    pt.attn.resize(widest, attn_kernel_is_fp32(attn_kernel_), m_.kv_int8_, attn_kernel_is_amx(attn_kernel_));
  }
}

RowMap CpuSession::row_map(const CacheMap& c, bool suffix, int n, int h, int64_t row0) const {
  RowMap r;
  r.stride = c.s2;
  r.row0 = row0;
  if (!kv_.paged()) {
    r.base = c.data + n * c.s0 + h * c.s1;
    return r;
  }
  const int64_t width = (suffix ? kv_.Q : kv_.P) / kv_.page_size;
  r.base = c.data + h * c.s1;
  r.pages = (suffix ? kv_.suffix_pages : kv_.prompt_pages).data() + n * width;
  r.page_shift = std::countr_zero(static_cast<unsigned>(kv_.page_size));
  r.page_stride = c.s0;
  return r;
}

void CpuSession::quantise_cache(const KVCache& kv) {
  const int L = cfg_.L, Hkv = cfg_.Hkv, d = cfg_.d;
  // The attended rows only (prompt rows after the padding, up to the valid length; suffix rows up to each sample's
  // length), packed per (sequence, head).
  i8_prompt_row0_.assign(size_t(kv.G) * Hkv + 1, 0);
  for (int g = 0; g < kv.G; ++g)
    for (int h = 0; h < Hkv; ++h)
      i8_prompt_row0_[size_t(g) * Hkv + h + 1] = i8_prompt_row0_[size_t(g) * Hkv + h] + size_t(kv.valid_len[g] - kv.pad(g));
  const bool suffixes = !kv.suffix_key.empty();
  i8_suffix_row0_.assign(suffixes ? size_t(kv.B) * Hkv + 1 : 0, 0);
  for (int b = 0; b < kv.B && suffixes; ++b)
    for (int h = 0; h < Hkv; ++h)
      i8_suffix_row0_[size_t(b) * Hkv + h + 1] = i8_suffix_row0_[size_t(b) * Hkv + h] + size_t(kv.suffix(b));
  i8_prompt_.resize(L);
  i8_suffix_.resize(suffixes ? L : 0);
  for (int l = 0; l < L; ++l) {
    i8_prompt_[l].ensure(i8_prompt_row0_.back(), d);
    if (suffixes) i8_suffix_[l].ensure(i8_suffix_row0_.back(), d);
  }
  // Units of one (layer, sequence, head) over the session's pool.
  struct Unit {
    const TensorView *k, *v;
    Int8Rows* out;
    bool suffix;
    int n, h;           // the sequence (prompt, or sample's suffix) and head
    int64_t src0;       // its first attended row
    size_t dst0;        // where it goes in `out`
    int64_t rows;
  };
  std::vector<Unit> units;
  for (int l = 0; l < L; ++l) {
    for (int g = 0; g < kv.G; ++g)
      for (int h = 0; h < Hkv; ++h)
        units.push_back({&kv.key[l], &kv.value[l], &i8_prompt_[l], false, g, h, kv.pad(g),
                         i8_prompt_row0_[size_t(g) * Hkv + h], kv.valid_len[g] - kv.pad(g)});
    for (int b = 0; b < kv.B && suffixes; ++b)
      for (int h = 0; h < Hkv; ++h)
        units.push_back({&kv.suffix_key[l], &kv.suffix_value[l], &i8_suffix_[l], true, b, h, 0,
                         i8_suffix_row0_[size_t(b) * Hkv + h], kv.suffix(b)});
  }
  // Row `row` of sequence n, head h of t (any strides, or a page pool: kv_row_offset) quantised into row `dst` of
  // q, from the cache's dtype (F16 through fp32).
  auto quantise = [d, &kv](const TensorView& t, const Unit& un, int64_t row, size_t dst, int bias, void* q,
                           std::vector<float>& tmp) {
    const int64_t off = kv_row_offset(kv, t, un.suffix, un.n, un.h, row);
    int8_t* out = static_cast<int8_t*>(q) + dst * d;
    if (t.dtype == DType::BF16) return quantize_row_avx2(static_cast<const uint16_t*>(t.data) + off, true, d, bias, out);
    if (t.dtype == DType::F32) return quantize_row_avx2(static_cast<const float*>(t.data) + off, false, d, bias, out);
    const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
    for (int c = 0; c < d; ++c) tmp[c] = f16_to_f32(p[c]);
    return quantize_row_avx2(tmp.data(), false, d, bias, out);
  };
  pool_.run([&](int tid) {
    std::vector<float> tmp(d);
    for (size_t u = tid; u < units.size(); u += nthreads_) {
      const Unit& un = units[u];
      for (int64_t j = 0; j < un.rows; ++j) {
        const size_t dst = un.dst0 + size_t(j);
        un.out->ks[dst] = quantise(*un.k, un, un.src0 + j, dst, 128, un.out->k.data(), tmp);
        un.out->vs[dst] = quantise(*un.v, un, un.src0 + j, dst, 0, un.out->v.data(), tmp);
      }
    }
  });
}

void CpuSession::set_attention_kernel(AttnKernel k) {
  if (const std::string why = attn_kernel_unavailable(k, m_.kv_int8_); !why.empty())
    throw Error(ErrorCode::Unsupported, std::string("cpu backend: attention kernel ") + attn_kernel_name(k) + " cannot run here: " + why);
  attn_kernel_ = k;
  if (attn_widest_.d > 0)  // already bound: the scratch of the new kernel
    for (PerThread& pt : per_thread_) pt.attn.resize(attn_widest_, attn_kernel_is_fp32(k), m_.kv_int8_, attn_kernel_is_amx(k));
}

uint32_t* CpuSession::qptr(int b, int g) {
  const int p = kv_.prompt(b);
  const size_t n = members_[p].size(), half = cfg_.d / 2;
  return qp_.data() + qbase_[p] + (size_t(g) * n * half + member_[b]) * geo_.Rp;
}

size_t CpuSession::step_buffer_bytes() const {
  size_t n = (cos_.size() + sin_.size()) * sizeof(float);
  for (size_t b : {h_.bytes(), qkv_.bytes(), act_f32_.bytes(), x_scale_.bytes(), y_scale_.bytes(), part_o_.bytes(),
                   part_m_.bytes(), part_l_.bytes(), x_bf16_.bytes(), y_bf16_.bytes(), k_own_.bytes(), v_own_.bytes(),
                   x_u8_.bytes(), y_u8_.bytes(), qp_.bytes()})
    n += b;
  for (const auto& c : owned_cache_) n += c.bytes();
  for (const auto& c : i8_prompt_) n += c.bytes();
  for (const auto& c : i8_suffix_) n += c.bytes();
  n += i8_own_.bytes();
  for (const PerThread& pt : per_thread_)
    n += pt.tmp.bytes() + pt.row.bytes() + pt.scratch.bytes() + pt.attn.bytes();
  for (const auto& layer : plans_)
    for (const LayerPlans& p : layer) n += p.qkv.own_bytes() + p.o.own_bytes() + p.gate_up.own_bytes() + p.down.own_bytes();
  return n;
}

void CpuSession::plan_attention() {
  // Chunks of the key sequences sized from the context alone, never from the thread count, so that the
  // online-softmax blocks and log-sum-exp merges, and with them every rounding, are the same for any
  // number of threads: about kAttnItems items (enough to balance 8 to 16 threads), on average at least 4 key
  // blocks each. Samples sharing a prompt attend to its rows in cascade items (the prompt read once
  // for all of them), whose cost counts the number of samples.
  const int Hkv = cfg_.Hkv;
  auto own_rows = [&](int b) {  // keys of b's own sample items
    return (shares_prompt(b) ? 0 : kv_.valid_len[kv_.prompt(b)] - kv_.pad(kv_.prompt(b))) + kv_.suffix(b) + T_;
  };
  int64_t total = 0;
  for (int b = 0; b < B_; ++b) total += int64_t(Hkv) * own_rows(b);
  for (int p = 0; p < kv_.G; ++p)
    if (members_[p].size() > 1)
      total += int64_t(Hkv) * members_[p].size() * (kv_.valid_len[p] - kv_.pad(p));
  constexpr int64_t kAttnItems = 32;  // 4 chunks per head at the seed's size (docs/CPU_BACKEND.md, docs/PERFORMANCE.md)
  const int64_t target = (total + kAttnItems - 1) / kAttnItems;
  const int64_t chunk = std::max<int64_t>(4 * kKeyBlock, (target + kKeyBlock - 1) / kKeyBlock * kKeyBlock);
  // The parts of one key range shrink linearly (weights parts, parts-1, ..., 1) and are claimed largest first,
  // so that the last items, whose length is the threads' wait at the merge barrier, are the shortest.
  auto bound = [](int64_t n, int c, int parts) {  // start of part c of n keys
    const int64_t w = int64_t(parts) * (parts + 1) / 2, before = int64_t(c) * parts - int64_t(c) * (c - 1) / 2;
    return static_cast<int>(n * before / w);
  };
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
        items_.push_back({members_[p][0], g, bound(rows, c, parts), bound(rows, c + 1, parts), slot, p, n});
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
        items_.push_back({b, g, bound(n, c, parts), bound(n, c + 1, parts), slot});
        merge_slots_[size_t(b) * Hkv + g].push_back(slot++);
      }
    }
  // Each item carries its slot, so the claiming order leaves the merges (in slot order) unchanged.
  std::stable_sort(items_.begin(), items_.end(), [](const AttnItem& a, const AttnItem& b) {
    return int64_t(a.j1 - a.j0) * a.count > int64_t(b.j1 - b.j0) * b.count;
  });
  items_work_ = 0;
  for (const AttnItem& it : items_) items_work_ += int64_t(it.j1 - it.j0) * it.count;
}

}  // namespace cpu
}  // namespace alpamayo
