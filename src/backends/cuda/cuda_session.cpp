// CudaSession: binding (buffers, cache, plans) and the denoising call (graph capture and replay).
#include "backends/cuda/cuda_session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

#include "alpamayo/error.h"

namespace alpamayo::ALP_CUDA_NS {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt workspace (split-K), per session

// Stream capture and the calls CUDA forbids around it (allocation, frees, synchronous copies) are kept
// apart across every cuda session in the process: one lock, held while a session allocates or frees its
// buffers and while it captures. Replays never take it.
std::mutex& capture_lock() {
  static std::mutex m;
  return m;
}

CacheType cache_type(const TensorView& t) {
  return t.dtype == DType::F32 ? CacheType::F32 : t.dtype == DType::F16 ? CacheType::F16 : CacheType::BF16;
}

// One key sequence of the attention cascade (kernels.h, AttnItem) and the samples whose query rows read it.
struct KeySeq {
  int prompt, pad, np, sb, ns, nown;
  std::vector<int> members;
  int n() const { return np + ns + nown; }
  int tiles(int R) const { return (int(members.size()) * R + kAttnRowsPerCta - 1) / kAttnRowsPerCta; }
};

// Key blocks of 64 per work item: the fewest waves of CTAs over the GPU's CTA slots, each wave as long as its
// items (+1 block for the query load and the partial write); ties go to longer items (less merging).
int blocks_per_item(const std::vector<KeySeq>& seqs, int R, int Hkv, int slots) {
  const int KB = kAttnKeysPerBlock;
  int max_blocks = 1;
  for (const KeySeq& q : seqs) max_blocks = std::max(max_blocks, (q.n() + KB - 1) / KB);
  int best = max_blocks;
  double best_cost = 1e300;
  for (int cb = max_blocks; cb >= 1; --cb) {
    int64_t ctas = 0;
    for (const KeySeq& q : seqs) ctas += int64_t((q.n() + KB - 1) / KB + cb - 1) / cb * q.tiles(R) * Hkv;
    const int64_t waves = (ctas + slots - 1) / slots;
    const double cost = double(waves) * (cb + 1);
    if (cost < best_cost) {
      best_cost = cost;
      best = cb;
    }
  }
  return best;
}

}  // namespace

CudaSession::Run::~Run() {
  if (exec) (void)cudaGraphExecDestroy(exec);
  if (graph) (void)cudaGraphDestroy(graph);
  for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
}

CudaSession::CudaSession(const CudaModel& m) : m_(m), cfg_(m.config()) {
  DeviceGuard g(m_.device());
  ALP_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  check_cublas(cublasLtCreate(&lt_), "cublasLtCreate");
}

CudaSession::~CudaSession() {
  try {
    DeviceGuard g(m_.device());
    if (stream_) (void)cudaStreamSynchronize(stream_);
    std::lock_guard<std::mutex> lock(capture_lock());
    release();
  } catch (...) {
  }
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

size_t CudaSession::Pass::bytes() const {
  size_t n = 0;
  for (const DeviceBuffer* b : {&prompt_pages, &suffix_pages, &cos, &sin, &items, &members, &slot_list, &slot_range, &part_o, &part_m, &part_l})
    n += b->bytes();
  for (const DeviceBuffer& b : owned) n += b.bytes();
  return n;
}

void CudaSession::release() {
  bound_ = false;
  runs_.clear();
  passes_.clear();
  for (DeviceBuffer* b : {&h_, &hidden_, &hidden_u_, &emb_, &act_, &act_rs_, &y_, &attn_f32_, &q_, &k_own_, &v_own_,
                          &x_, &feat_a_, &feat_b_, &cap_emb_, &cap_hidden_, &cap_layers_, &workspace_})
    *b = DeviceBuffer();
  cap_ = Captures{};
}

void CudaSession::bind(const Binding& b) {
  // Session::bind has refused what this backend does not declare (cuda::backend_info()): B within max_batch.
  DeviceGuard g(m_.device());
  ALP_CUDA(cudaStreamSynchronize(stream_));
  std::lock_guard<std::mutex> lock(capture_lock());
  release();
  const int L = cfg_.L, D = cfg_.D, Hq = cfg_.Hq, Hkv = cfg_.Hkv, d = cfg_.d, I = cfg_.I, A = cfg_.A;
  B_ = b.kv.B;
  T_ = b.rope.T;
  M_ = B_ * T_;
  Mp_ = static_cast<int>(round_up(M_, 16));
  req_ = b.capture;
  const bool f8 = m_.fp8();

  // Activations first: each pass's attention plan points at q_ and the own K/V.
  q_ = DeviceBuffer(size_t(M_) * Hq * d * sizeof(uint16_t));
  k_own_ = DeviceBuffer(size_t(M_) * Hkv * d * sizeof(uint16_t));
  v_own_ = DeviceBuffer(size_t(M_) * Hkv * d * sizeof(uint16_t));
  passes_.resize(b.guided ? 2 : 1);
  bind_pass(passes_[0], b.kv, b.rope);
  if (b.guided) bind_pass(passes_[1], b.unguided_kv, b.unguided_rope);
  // The host loop's rounding of the weights (host_loop.cpp): 1 - w in double, then both to fp32.
  wu_ = static_cast<float>(1.0 - b.guidance_weight);
  wg_ = static_cast<float>(b.guidance_weight);

  // Matmul plans first: they size the matmul output buffer (split-K partials). Both passes run the same M rows,
  // so they share the plans (and a pass gives bitwise the result of its context bound alone).
  const int Nqkv = (Hq + 2 * Hkv) * d, Kmax = std::max({D, Hq * d, I});
  const GemmImpl gi = m_.gemm();
  const int sms = m_.sm_count();
  mm_qkv_.plan(gi, lt_, f8, Nqkv, D, Mp_, M_, sms, kWorkspaceBytes, "qkv projection");
  mm_o_.plan(gi, lt_, f8, D, Hq * d, Mp_, M_, sms, kWorkspaceBytes, "o_proj");
  mm_gu_.plan(gi, lt_, f8, 2 * I, D, Mp_, M_, sms, kWorkspaceBytes, "gate/up projection");
  mm_down_.plan(gi, lt_, f8, D, I, Mp_, M_, sms, kWorkspaceBytes, "down_proj");
  const size_t y_floats =
      std::max({mm_qkv_.out_floats(), mm_o_.out_floats(), mm_gu_.out_floats(), mm_down_.out_floats()});

  // act_ is the input of every weight matmul (bf16, or e4m3 with act_rs_ row scales for cuBLASLt's fp8 path);
  // y_ receives every matmul output in fp32. Rows [M, Mp) only pad the matmuls.
  const bool f8a = m_.fp8_activations();
  h_ = DeviceBuffer(size_t(Mp_) * D * sizeof(float));
  hidden_ = DeviceBuffer(size_t(Mp_) * D * sizeof(float));
  if (b.guided) {  // the unguided pass's output, and action_in_proj's output kept for it
    hidden_u_ = DeviceBuffer(size_t(Mp_) * D * sizeof(float));
    emb_ = DeviceBuffer(size_t(M_) * D * sizeof(float));
  }
  act_ = DeviceBuffer(size_t(Mp_) * Kmax * (f8a ? 1 : 2));
  act_rs_ = DeviceBuffer(size_t(Mp_) * sizeof(float));
  y_ = DeviceBuffer(y_floats * sizeof(float));
  if (f8a) attn_f32_ = DeviceBuffer(size_t(Mp_) * Hq * d * sizeof(float));
  x_ = DeviceBuffer(size_t(M_) * A * sizeof(float));
  int feat = (A + 1) * cfg_.n_fourier;
  for (int o : m_.proj().trunk_out) feat = std::max(feat, o);
  feat_a_ = DeviceBuffer(size_t(Mp_) * feat * sizeof(float));
  feat_b_ = DeviceBuffer(size_t(Mp_) * feat * sizeof(float));
  for (DeviceBuffer* z : {&h_, &hidden_, &hidden_u_, &act_, &act_rs_, &y_})
    if (z->bytes()) ALP_CUDA(cudaMemsetAsync(z->get(), 0, z->bytes(), stream_));
  workspace_ = DeviceBuffer(gi == GemmImpl::Lt ? kWorkspaceBytes : 0);

  if (req_.step >= 0) {
    const size_t n = size_t(M_) * D;
    cap_emb_ = DeviceBuffer(n * sizeof(float));
    cap_hidden_ = DeviceBuffer(n * sizeof(float));
    if (req_.layers) cap_layers_ = DeviceBuffer(size_t(L) * n * sizeof(float));
  }
  ALP_CUDA(cudaStreamSynchronize(stream_));
  bound_ = true;
}

// One context: every layer's prompt and suffix caches (only the rows some sample reads: prompt rows after the
// left padding of prompts that samples name, suffix rows below each sample's length), the rope tables and the
// attention plan.
void CudaSession::bind_pass(Pass& ps, const KVCache& kv, const RopeTables& rope) {
  const int L = cfg_.L;
  std::vector<int> plo(kv.G, 0), phi(kv.G, 0), slo(kv.B, 0), shi(kv.B, 0);
  for (int b = 0; b < kv.B; ++b) {
    const int g = kv.prompt(b);
    plo[g] = static_cast<int>(kv.pad(g));
    phi[g] = static_cast<int>(kv.valid_len[g]);
    shi[b] = static_cast<int>(kv.suffix(b));
  }
  const bool suffixes = !kv.suffix_key.empty();
  if (kv.paged()) {  // read by the kernels of every replay: kept at fixed addresses until the next bind
    auto upload = [](DeviceBuffer& dst, const std::vector<int64_t>& src) {
      dst = DeviceBuffer(src.size() * sizeof(int64_t));
      if (!src.empty()) ALP_CUDA(cudaMemcpy(dst.get(), src.data(), dst.bytes(), cudaMemcpyHostToDevice));
    };
    upload(ps.prompt_pages, kv.prompt_pages);
    if (suffixes) upload(ps.suffix_pages, kv.suffix_pages);
  }
  ps.k.assign(L, KVView{});
  ps.v.assign(L, KVView{});
  ps.k_suffix.assign(L, KVView{});
  ps.v_suffix.assign(L, KVView{});
  for (int l = 0; l < L; ++l) {
    ps.k[l] = bind_tensor(ps, kv, kv.key[l], false, kv.G, kv.P, plo, phi);
    ps.v[l] = bind_tensor(ps, kv, kv.value[l], false, kv.G, kv.P, plo, phi);
    if (suffixes) {
      ps.k_suffix[l] = bind_tensor(ps, kv, kv.suffix_key[l], true, kv.B, kv.Q, slo, shi);
      ps.v_suffix[l] = bind_tensor(ps, kv, kv.suffix_value[l], true, kv.B, kv.Q, slo, shi);
    }
  }
  ps.cos = DeviceBuffer(rope.cos.size() * sizeof(float));
  ps.sin = DeviceBuffer(rope.sin.size() * sizeof(float));
  ALP_CUDA(cudaMemcpy(ps.cos.get(), rope.cos.data(), ps.cos.bytes(), cudaMemcpyHostToDevice));
  ALP_CUDA(cudaMemcpy(ps.sin.get(), rope.sin.data(), ps.sin.bytes(), cudaMemcpyHostToDevice));
  plan_attention(ps, kv);
}

// A cache tensor of `planes` sequences (prompts, or samples' suffixes) of `rows` rows, any strides, paged or not,
// as bf16 in this GPU's memory, of which rows [lo[n], hi[n]) of each sequence n are read: in place when it already
// is (bf16, every row 16-byte aligned), else converted on the device or gathered and uploaded once into a dense
// [planes, Hkv, rows, d] buffer. Device-resident tensors are first checked to be this GPU's memory and scanned
// for NaN/Inf in those rows, through the same addressing as the attention kernel.
KVView CudaSession::bind_tensor(Pass& ps, const KVCache& kv, const TensorView& t, bool suffix, int planes, int rows,
                                const std::vector<int>& lo, const std::vector<int>& hi) {
  const int H = cfg_.Hkv, d = cfg_.d;
  const size_t plane = size_t(rows) * d, total = size_t(planes) * H * plane;
  KVView dense;  // what an upload or conversion produces
  dense.seq = int64_t(H) * rows * d;
  dense.head = int64_t(rows) * d;
  dense.row = d;
  if (t.device.type != DeviceType::CUDA) {
    DeviceBuffer& own = ps.owned.emplace_back(total * sizeof(uint16_t));
    upload_rows(kv, t, suffix, planes, rows, lo, hi, own.as<uint16_t>());
    dense.base = own.get();
    return dense;
  }
  cudaPointerAttributes attr{};
  ALP_CUDA(cudaPointerGetAttributes(&attr, t.data));
  const bool dev_mem = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  check(dev_mem && attr.device == m_.device(),
        t.name + ": said to live in " + t.device.str() + " memory, but the cuda backend finds " +
            (dev_mem ? "memory of cuda:" + std::to_string(attr.device) : std::string("host memory")) +
            " at that address");
  // The view's addressing: kv_row_offset's strides, and the page table bound in bind_pass.
  KVView v;
  v.base = t.data;
  v.seq = t.strides.empty() ? t.shape[1] * t.shape[2] * t.shape[3] : t.strides[0];
  v.head = t.strides.empty() ? t.shape[2] * t.shape[3] : t.strides[1];
  v.row = t.strides.empty() ? t.shape[3] : t.strides[2];
  if (kv.paged()) {
    v.pages = (suffix ? ps.suffix_pages : ps.prompt_pages).as<int64_t>();
    v.width = (suffix ? kv.Q : kv.P) / kv.page_size;
    while ((1 << v.page_shift) < kv.page_size) ++v.page_shift;
  }
  DeviceBuffer range(2 * lo.size() * sizeof(int)), first(sizeof(unsigned long long));
  ALP_CUDA(cudaMemcpy(range.get(), lo.data(), lo.size() * sizeof(int), cudaMemcpyHostToDevice));
  ALP_CUDA(cudaMemcpy(range.as<int>() + lo.size(), hi.data(), hi.size() * sizeof(int), cudaMemcpyHostToDevice));
  ALP_CUDA(cudaMemsetAsync(first.get(), 0xff, first.bytes(), stream_));
  const int* dlo = range.as<int>();
  const int* dhi = dlo + lo.size();
  scan_nonfinite(stream_, v, cache_type(t), planes, H, rows, d, dlo, dhi, first.as<unsigned long long>());
  unsigned long long f = 0;
  ALP_CUDA(cudaMemcpyAsync(&f, first.get(), sizeof f, cudaMemcpyDeviceToHost, stream_));
  ALP_CUDA(cudaStreamSynchronize(stream_));
  if (f != ~0ull) {
    const unsigned long long bh = f / plane, row = (f % plane) / d, col = f % d;
    throw Error(ErrorCode::NonFinite, t.name + ": non-finite value at [" + std::to_string(bh / H) + ", " +
                                          std::to_string(bh % H) + ", " + std::to_string(row) + ", " +
                                          std::to_string(col) + "]" + (kv.paged() ? " (sequence, head, row)" : ""));
  }
  // cp.async reads 16-byte chunks: the base and every stride must keep rows 16-byte aligned.
  const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && v.seq % 8 == 0 && v.head % 8 == 0 &&
                       v.row % 8 == 0;
  if (t.dtype == DType::BF16 && aligned) return v;  // bound in place: no copy
  DeviceBuffer& own = ps.owned.emplace_back(total * sizeof(uint16_t));
  convert_cache_bf16(stream_, v, cache_type(t), planes, H, rows, d, dlo, dhi, own.as<uint16_t>());
  ALP_CUDA(cudaStreamSynchronize(stream_));  // `range` is freed on return
  dense.base = own.get();
  return dense;
}

// Host memory: the rows read of each (sequence, head), found by kv_row_offset (strided or paged), gathered and
// converted to bf16 on the host, one copy per (sequence, head) into the dense dst [planes, Hkv, rows, d].
void CudaSession::upload_rows(const KVCache& kv, const TensorView& t, bool suffix, int planes, int rows,
                              const std::vector<int>& lo, const std::vector<int>& hi, uint16_t* dst) {
  const int H = cfg_.Hkv, d = cfg_.d;
  std::vector<uint16_t> host;
  for (int n = 0; n < planes; ++n)
    for (int h = 0; h < H; ++h) {
      const int count = hi[n] - lo[n];
      if (count <= 0) continue;
      host.resize(size_t(count) * d);
      for (int i = 0; i < count; ++i) {
        const TensorView row = kv_row_view(kv, t, suffix, n, h, lo[n] + i);
        if (t.dtype == DType::BF16)
          std::memcpy(host.data() + size_t(i) * d, row.data, size_t(d) * sizeof(uint16_t));
        else
          convert_to_bf16(row, host.data() + size_t(i) * d);
      }
      const size_t off = (size_t(n) * H + h) * rows * d + size_t(lo[n]) * d;
      ALP_CUDA(cudaMemcpy(dst + off, host.data(), host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
}

// The cascade (kernels.h, attention): a prompt that k >= 2 samples read is one key sequence for all their query
// rows; every sample has a sequence of its own (its suffix and own rows, after its prompt's rows when it reads the
// prompt alone). Sequences are cut into work items of equal key blocks, as long as possible while the CTAs still
// fill the GPU (blocks_per_item).
void CudaSession::plan_attention(Pass& ps, const KVCache& kv) {
  const int Hkv = cfg_.Hkv, group = cfg_.Hq / cfg_.Hkv, KB = kAttnKeysPerBlock, R = group * T_;
  const int cta_slots = std::max(1, m_.sm_count() * m_.attention_ctas_per_sm());
  std::vector<std::vector<int>> readers(kv.G);
  for (int b = 0; b < kv.B; ++b) readers[kv.prompt(b)].push_back(b);
  std::vector<KeySeq> seqs;
  for (int g = 0; g < kv.G; ++g) {
    const int np = static_cast<int>(kv.valid_len[g] - kv.pad(g));
    if (readers[g].size() >= 2 && np > 0) seqs.push_back({g, int(kv.pad(g)), np, 0, 0, 0, readers[g]});
  }
  for (int b = 0; b < kv.B; ++b) {
    const int g = kv.prompt(b);
    const int np = readers[g].size() >= 2 ? 0 : static_cast<int>(kv.valid_len[g] - kv.pad(g));
    seqs.push_back({g, int(kv.pad(g)), np, b, int(kv.suffix(b)), T_, {b}});
  }
  int max_tiles = 1;
  for (const KeySeq& q : seqs) max_tiles = std::max(max_tiles, q.tiles(R));
  const int len = blocks_per_item(seqs, R, Hkv, cta_slots) * KB;
  std::vector<AttnItem> items;
  std::vector<int> members;
  std::vector<std::vector<int>> sample_slots(kv.B);
  int slots = 0;
  for (const KeySeq& q : seqs) {
    const int n = q.n(), q0 = static_cast<int>(members.size()), nq = int(q.members.size());
    members.insert(members.end(), q.members.begin(), q.members.end());
    for (int j0 = 0; j0 < n; j0 += len) {
      items.push_back({j0, std::min(n, j0 + len), q.prompt, q.pad, q.np, q.sb, q.ns, q.nown, q0, nq, slots});
      for (int i = 0; i < nq; ++i) sample_slots[q.members[i]].push_back(slots + i);
      slots += nq;
    }
  }
  std::vector<int> slot_list, slot_range(2 * kv.B);
  for (int b = 0; b < kv.B; ++b) {
    slot_range[2 * b] = static_cast<int>(slot_list.size());
    slot_range[2 * b + 1] = static_cast<int>(sample_slots[b].size());
    slot_list.insert(slot_list.end(), sample_slots[b].begin(), sample_slots[b].end());
  }
  auto upload = [](DeviceBuffer& dst, const void* src, size_t bytes) {
    dst = DeviceBuffer(bytes);
    ALP_CUDA(cudaMemcpy(dst.get(), src, bytes, cudaMemcpyHostToDevice));
  };
  upload(ps.items, items.data(), items.size() * sizeof(AttnItem));
  upload(ps.members, members.data(), members.size() * sizeof(int));
  upload(ps.slot_list, slot_list.data(), slot_list.size() * sizeof(int));
  upload(ps.slot_range, slot_range.data(), slot_range.size() * sizeof(int));
  ps.part_o = DeviceBuffer(size_t(slots) * Hkv * R * cfg_.d * sizeof(float));
  ps.part_m = DeviceBuffer(size_t(slots) * Hkv * R * sizeof(float));
  ps.part_l = DeviceBuffer(size_t(slots) * Hkv * R * sizeof(float));

  AttnParams& a = ps.attn;
  a = AttnParams{};
  a.q = q_.as<uint16_t>();
  a.k_own = k_own_.as<uint16_t>();
  a.v_own = v_own_.as<uint16_t>();
  a.items = ps.items.as<AttnItem>();
  a.members = ps.members.as<int>();
  a.slot_list = ps.slot_list.as<int>();
  a.slot_range = ps.slot_range.as<int>();
  a.part_o = ps.part_o.as<float>();
  a.part_m = ps.part_m.as<float>();
  a.part_l = ps.part_l.as<float>();
  a.n_items = static_cast<int>(items.size());
  a.B = kv.B;
  a.Hkv = Hkv;
  a.group = group;
  a.T = T_;
  a.P = kv.P;
  a.Q = kv.Q;
  a.d = cfg_.d;
  a.R = R;
  a.tiles = max_tiles;
}

CudaSession::Run& CudaSession::run_for(int steps) {
  if (auto it = runs_.find(steps); it != runs_.end()) return *it->second;
  std::lock_guard<std::mutex> lock(capture_lock());
  // One step count at a time keeps memory bounded; a sample of another length recaptures.
  runs_.clear();
  auto r = std::make_unique<Run>();
  r->steps = steps;
  const size_t n = size_t(M_) * cfg_.A;
  r->times = DeviceBuffer((steps + 1) * sizeof(float));
  r->x_hist = DeviceBuffer((steps + 1) * n * sizeof(float));
  r->v_hist = DeviceBuffer(steps * n * sizeof(float));
  r->h_x = PinnedBuffer(n * sizeof(float));
  r->h_times = PinnedBuffer((steps + 1) * sizeof(float));
  r->h_x_hist = PinnedBuffer((steps + 1) * n * sizeof(float));
  r->h_v_hist = PinnedBuffer(steps * n * sizeof(float));
  const bool graph = m_.use_graphs() && steps <= kMaxGraphSteps;
  if (steps <= kMaxGraphSteps) {
    r->events.resize(steps + 1, nullptr);
    for (cudaEvent_t& e : r->events) ALP_CUDA(cudaEventCreate(&e));
  }
  if (graph) {
    ALP_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_sample(*r, true);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream_, &broken);
      if (broken) (void)cudaGraphDestroy(broken);
      throw;
    }
    ALP_CUDA(cudaStreamEndCapture(stream_, &r->graph));
    ALP_CUDA(cudaGraphInstantiate(&r->exec, r->graph, 0));
  }
  return *runs_.emplace(steps, std::move(r)).first->second;
}

void CudaSession::denoise(const DenoiseArgs& a) {
  check(bound_, ErrorCode::InvalidState, "cuda backend: denoise before bind");
  DeviceGuard g(m_.device());
  Run& r = run_for(a.steps);
  const int N = a.steps;
  const size_t n = size_t(M_) * cfg_.A;
  std::memcpy(r.h_x.get(), a.x, n * sizeof(float));
  std::memcpy(r.h_times.get(), a.times, (N + 1) * sizeof(float));
  ALP_CUDA(cudaMemcpyAsync(x_.get(), r.h_x.get(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  ALP_CUDA(cudaMemcpyAsync(r.times.get(), r.h_times.get(), (N + 1) * sizeof(float), cudaMemcpyHostToDevice, stream_));
  if (r.exec)
    ALP_CUDA(cudaGraphLaunch(r.exec, stream_));
  else
    enqueue_sample(r, false);
  ALP_CUDA(cudaMemcpyAsync(r.h_x.get(), x_.get(), n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  ALP_CUDA(cudaMemcpyAsync(r.h_v_hist.get(), r.v_hist.get(), N * n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  if (a.x_steps)
    ALP_CUDA(cudaMemcpyAsync(r.h_x_hist.get(), r.x_hist.get(), (N + 1) * n * sizeof(float), cudaMemcpyDeviceToHost,
                             stream_));
  const bool captured = req_.step >= 0 && req_.step < N;
  cap_.step = -1;
  if (captured) {
    const size_t nd = size_t(M_) * cfg_.D;
    cap_.emb.resize(nd);
    cap_.hidden.resize(nd);
    ALP_CUDA(cudaMemcpyAsync(cap_.emb.data(), cap_emb_.get(), nd * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    ALP_CUDA(
        cudaMemcpyAsync(cap_.hidden.data(), cap_hidden_.get(), nd * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    if (req_.layers) {
      cap_.layers.assign(cfg_.L, std::vector<float>(nd));
      for (int l = 0; l < cfg_.L; ++l)
        ALP_CUDA(cudaMemcpyAsync(cap_.layers[l].data(), cap_layers_.as<float>() + l * nd, nd * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
    }
  }
  ALP_CUDA(cudaStreamSynchronize(stream_));

  const float* v = r.h_v_hist.as<float>();
  for (int k = 0; k < N; ++k)
    for (size_t i = 0; i < n; ++i)
      check(std::isfinite(v[k * n + i]), ErrorCode::NonFinite, "velocity at Euler step " + std::to_string(k) + ": non-finite value " +
                                             std::to_string(v[k * n + i]) + " at flat index " + std::to_string(i));
  std::memcpy(a.x, r.h_x.get(), n * sizeof(float));
  if (a.v_steps) std::memcpy(a.v_steps, v, N * n * sizeof(float));
  if (a.x_steps) std::memcpy(a.x_steps, r.h_x_hist.get(), (N + 1) * n * sizeof(float));
  if (captured) cap_.step = req_.step;
  if (a.step_seconds && !r.events.empty()) {
    a.step_seconds->clear();
    for (int k = 0; k < N; ++k) {
      float ms = 0.f;
      ALP_CUDA(cudaEventElapsedTime(&ms, r.events[k], r.events[k + 1]));
      a.step_seconds->push_back(ms * 1e-3);
    }
  }
}

size_t CudaSession::buffer_bytes() const {
  size_t n = 0;
  for (const DeviceBuffer* b : {&h_, &hidden_, &hidden_u_, &emb_, &act_, &act_rs_, &y_, &attn_f32_, &q_, &k_own_,
                                &v_own_, &x_, &feat_a_, &feat_b_, &cap_emb_, &cap_hidden_, &cap_layers_, &workspace_})
    n += b->bytes();
  for (const Pass& p : passes_) n += p.bytes();
  for (const auto& [steps, r] : runs_) n += r->times.bytes() + r->x_hist.bytes() + r->v_hist.bytes();
  return n;
}

}  // namespace alpamayo::ALP_CUDA_NS
