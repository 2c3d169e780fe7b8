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

void CudaSession::release() {
  bound_ = false;
  runs_.clear();
  owned_cache_.clear();
  k_cache_.clear();
  v_cache_.clear();
  for (DeviceBuffer* b :
       {&S_dev_,      &cos_,    &sin_,    &h_,      &hidden_,  &act_,        &act_rs_,     &y_,
        &attn_f32_,   &q_,      &k_own_,  &v_own_,  &x_,       &feat_a_,     &feat_b_,     &items_,
        &item_range_, &part_o_, &part_m_, &part_l_, &cap_emb_, &cap_hidden_, &cap_layers_, &workspace_})
    *b = DeviceBuffer();
  cap_ = Captures{};
}

void CudaSession::bind(const Binding& b) {
  // Session::bind has refused what this backend does not declare (cuda_registry.cpp): no shared prompts, suffix
  // rows, left padding or guidance, and B * Hkv within the attention grid.
  DeviceGuard g(m_.device());
  ALP_CUDA(cudaStreamSynchronize(stream_));
  std::lock_guard<std::mutex> lock(capture_lock());
  release();
  const int L = cfg_.L, D = cfg_.D, Hq = cfg_.Hq, Hkv = cfg_.Hkv, d = cfg_.d, I = cfg_.I, A = cfg_.A;
  B_ = b.kv.B;
  T_ = b.rope.T;
  M_ = B_ * T_;
  Mp_ = static_cast<int>(round_up(M_, 16));
  P_ = b.kv.P;
  S_.assign(b.kv.valid_len.begin(), b.kv.valid_len.end());
  req_ = b.capture;
  const bool f8 = m_.fp8();

  bind_cache(b.kv);

  cos_ = DeviceBuffer(b.rope.cos.size() * sizeof(float));
  sin_ = DeviceBuffer(b.rope.sin.size() * sizeof(float));
  ALP_CUDA(cudaMemcpy(cos_.get(), b.rope.cos.data(), cos_.bytes(), cudaMemcpyHostToDevice));
  ALP_CUDA(cudaMemcpy(sin_.get(), b.rope.sin.data(), sin_.bytes(), cudaMemcpyHostToDevice));

  // Matmul plans first: they size the matmul output buffer (split-K partials).
  const int Nqkv = (Hq + 2 * Hkv) * d, Kmax = std::max({D, Hq * d, I});
  const GemmImpl gi = m_.gemm();
  const int sms = m_.sm_count();
  mm_qkv_.plan(gi, lt_, f8, Nqkv, D, Mp_, M_, sms, kWorkspaceBytes, "qkv projection");
  mm_o_.plan(gi, lt_, f8, D, Hq * d, Mp_, M_, sms, kWorkspaceBytes, "o_proj");
  mm_gu_.plan(gi, lt_, f8, 2 * I, D, Mp_, M_, sms, kWorkspaceBytes, "gate/up projection");
  mm_down_.plan(gi, lt_, f8, D, I, Mp_, M_, sms, kWorkspaceBytes, "down_proj");
  const size_t y_floats =
      std::max({mm_qkv_.out_floats(), mm_o_.out_floats(), mm_gu_.out_floats(), mm_down_.out_floats()});

  // Activations. act_ is the input of every weight matmul (bf16, or e4m3 with act_rs_ row scales for
  // cuBLASLt's fp8 path); y_ receives every matmul output in fp32. Rows [M, Mp) only pad the matmuls.
  const bool f8a = m_.fp8_activations();
  h_ = DeviceBuffer(size_t(Mp_) * D * sizeof(float));
  hidden_ = DeviceBuffer(size_t(Mp_) * D * sizeof(float));
  act_ = DeviceBuffer(size_t(Mp_) * Kmax * (f8a ? 1 : 2));
  act_rs_ = DeviceBuffer(size_t(Mp_) * sizeof(float));
  y_ = DeviceBuffer(y_floats * sizeof(float));
  if (f8a) attn_f32_ = DeviceBuffer(size_t(Mp_) * Hq * d * sizeof(float));
  q_ = DeviceBuffer(size_t(M_) * Hq * d * sizeof(uint16_t));
  k_own_ = DeviceBuffer(size_t(M_) * Hkv * d * sizeof(uint16_t));
  v_own_ = DeviceBuffer(size_t(M_) * Hkv * d * sizeof(uint16_t));
  x_ = DeviceBuffer(size_t(M_) * A * sizeof(float));
  int feat = (A + 1) * cfg_.n_fourier;
  for (int o : m_.proj().trunk_out) feat = std::max(feat, o);
  feat_a_ = DeviceBuffer(size_t(Mp_) * feat * sizeof(float));
  feat_b_ = DeviceBuffer(size_t(Mp_) * feat * sizeof(float));
  for (DeviceBuffer* z : {&h_, &hidden_, &act_, &act_rs_, &y_})
    ALP_CUDA(cudaMemsetAsync(z->get(), 0, z->bytes(), stream_));
  workspace_ = DeviceBuffer(gi == GemmImpl::Lt ? kWorkspaceBytes : 0);

  plan_attention();

  if (req_.step >= 0) {
    const size_t n = size_t(M_) * D;
    cap_emb_ = DeviceBuffer(n * sizeof(float));
    cap_hidden_ = DeviceBuffer(n * sizeof(float));
    if (req_.layers) cap_layers_ = DeviceBuffer(size_t(L) * n * sizeof(float));
  }
  ALP_CUDA(cudaStreamSynchronize(stream_));
  bound_ = true;
}

void CudaSession::bind_cache(const KVCache& kv) {
  const int L = cfg_.L, H = kv.Hkv, P = kv.P, d = kv.d;
  std::vector<int> S(S_);
  S_dev_ = DeviceBuffer(S.size() * sizeof(int));
  ALP_CUDA(cudaMemcpy(S_dev_.get(), S.data(), S_dev_.bytes(), cudaMemcpyHostToDevice));
  const size_t plane = size_t(P) * d, total = size_t(B_) * H * plane;

  // Device-resident tensors: check that the pointer really is memory of this GPU, then scan their valid
  // rows for NaN/Inf (one result per tensor, read back once).
  std::vector<const TensorView*> all;
  for (int l = 0; l < L; ++l) all.insert(all.end(), {&kv.key[l], &kv.value[l]});
  std::vector<const TensorView*> on_device;
  for (const TensorView* t : all) {
    if (t->device.type != DeviceType::CUDA) continue;
    cudaPointerAttributes attr{};
    ALP_CUDA(cudaPointerGetAttributes(&attr, t->data));
    const bool dev_mem = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    check(dev_mem && attr.device == m_.device(),
          t->name + ": said to live in " + t->device.str() + " memory, but the cuda backend finds " +
              (dev_mem ? "memory of cuda:" + std::to_string(attr.device) : std::string("host memory")) +
              " at that address");
    on_device.push_back(t);
  }
  if (!on_device.empty()) {
    DeviceBuffer first(on_device.size() * sizeof(unsigned long long));
    ALP_CUDA(cudaMemsetAsync(first.get(), 0xff, first.bytes(), stream_));
    for (size_t i = 0; i < on_device.size(); ++i)
      scan_nonfinite(stream_, on_device[i]->data, cache_type(*on_device[i]), B_, H, P, d, S_dev_.as<int>(),
                     first.as<unsigned long long>() + i);
    std::vector<unsigned long long> found(on_device.size());
    ALP_CUDA(cudaMemcpyAsync(found.data(), first.get(), first.bytes(), cudaMemcpyDeviceToHost, stream_));
    ALP_CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < found.size(); ++i) {
      if (found[i] == ~0ull) continue;
      const unsigned long long f = found[i];
      const unsigned long long bh = f / plane, row = (f % plane) / d, col = f % d;
      throw Error(ErrorCode::NonFinite, on_device[i]->name + ": non-finite value at [" + std::to_string(bh / H) + ", " +
                  std::to_string(bh % H) + ", " + std::to_string(row) + ", " + std::to_string(col) + "]");
    }
  }

  k_cache_.assign(L, nullptr);
  v_cache_.assign(L, nullptr);
  std::vector<uint16_t> host;
  for (int l = 0; l < L; ++l)
    for (int which = 0; which < 2; ++which) {
      const TensorView& t = which == 0 ? kv.key[l] : kv.value[l];
      const uint16_t*& dst = (which == 0 ? k_cache_ : v_cache_)[l];
      const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
      if (t.device.type == DeviceType::CUDA && t.dtype == DType::BF16 && aligned) {
        dst = static_cast<const uint16_t*>(t.data);  // bound in place: no copy
        continue;
      }
      DeviceBuffer& own = owned_cache_.emplace_back(total * sizeof(uint16_t));
      dst = own.as<uint16_t>();
      if (t.device.type == DeviceType::CUDA) {
        convert_cache_bf16(stream_, t.data, cache_type(t), B_, H, P, d, S_dev_.as<int>(), own.as<uint16_t>());
        continue;
      }
      // Host memory: the valid rows of each (sample, head) plane, converted to bf16 on the host if needed.
      const size_t es = dtype_size(t.dtype);
      for (int b = 0; b < B_; ++b)
        for (int h = 0; h < H; ++h) {
          const size_t n = size_t(S_[b]) * d, off = (size_t(b) * H + h) * plane;
          if (n == 0) continue;
          const void* src = static_cast<const uint8_t*>(t.data) + off * es;
          if (t.dtype != DType::BF16) {
            host.resize(n);
            convert_to_bf16(TensorView{t.dtype, {int64_t(n)}, src, t.name}, host.data());
            src = host.data();
          }
          ALP_CUDA(cudaMemcpy(own.as<uint16_t>() + off, src, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
        }
    }
}

void CudaSession::plan_attention() {
  const int Hkv = cfg_.Hkv, group = cfg_.Hq / cfg_.Hkv, KB = kAttnKeysPerBlock;
  const int R = group * T_, tiles = (R + kAttnRowsPerCta - 1) / kAttnRowsPerCta;
  const int slots = std::max(1, m_.sm_count() * m_.attention_ctas_per_sm());
  std::vector<int> blocks(B_);
  int max_blocks = 1;
  for (int b = 0; b < B_; ++b) {
    blocks[b] = (S_[b] + T_ + KB - 1) / KB;
    max_blocks = std::max(max_blocks, blocks[b]);
  }
  // Blocks of 64 keys per work item: the fewest waves of CTAs over the SMs, each wave as long as its items
  // (+1 block for the query load and the partial write); ties go to longer items (less merging).
  int best = max_blocks;
  double best_cost = 1e300;
  for (int cb = max_blocks; cb >= 1; --cb) {
    int64_t items = 0;
    for (int nb : blocks) items += (nb + cb - 1) / cb;
    const int64_t ctas = items * Hkv * tiles, waves = (ctas + slots - 1) / slots;
    const double cost = double(waves) * (cb + 1);
    if (cost < best_cost) {
      best_cost = cost;
      best = cb;
    }
  }
  std::vector<AttnItem> items;
  std::vector<int> range(2 * B_);
  for (int b = 0; b < B_; ++b) {
    const int n = S_[b] + T_, len = best * KB;
    range[2 * b] = static_cast<int>(items.size());
    for (int j0 = 0; j0 < n; j0 += len) items.push_back({b, j0, std::min(n, j0 + len), S_[b]});
    range[2 * b + 1] = static_cast<int>(items.size()) - range[2 * b];
  }
  items_ = DeviceBuffer(items.size() * sizeof(AttnItem));
  item_range_ = DeviceBuffer(range.size() * sizeof(int));
  ALP_CUDA(cudaMemcpy(items_.get(), items.data(), items_.bytes(), cudaMemcpyHostToDevice));
  ALP_CUDA(cudaMemcpy(item_range_.get(), range.data(), item_range_.bytes(), cudaMemcpyHostToDevice));
  const int Rp = tiles * kAttnRowsPerCta;
  part_o_ = DeviceBuffer(items.size() * Hkv * Rp * cfg_.d * sizeof(float));
  part_m_ = DeviceBuffer(items.size() * Hkv * Rp * sizeof(float));
  part_l_ = DeviceBuffer(items.size() * Hkv * Rp * sizeof(float));

  attn_ = AttnParams{};
  attn_.q = q_.as<uint16_t>();
  attn_.k_own = k_own_.as<uint16_t>();
  attn_.v_own = v_own_.as<uint16_t>();
  attn_.items = items_.as<AttnItem>();
  attn_.item_range = item_range_.as<int>();
  attn_.part_o = part_o_.as<float>();
  attn_.part_m = part_m_.as<float>();
  attn_.part_l = part_l_.as<float>();
  attn_.n_items = static_cast<int>(items.size());
  attn_.B = B_;
  attn_.Hkv = Hkv;
  attn_.group = group;
  attn_.T = T_;
  attn_.P = P_;
  attn_.d = cfg_.d;
  attn_.R = R;
  attn_.Rp = Rp;
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
  for (const DeviceBuffer* b :
       {&S_dev_,      &cos_,    &sin_,    &h_,      &hidden_,  &act_,        &act_rs_,     &y_,
        &attn_f32_,   &q_,      &k_own_,  &v_own_,  &x_,       &feat_a_,     &feat_b_,     &items_,
        &item_range_, &part_o_, &part_m_, &part_l_, &cap_emb_, &cap_hidden_, &cap_layers_, &workspace_})
    n += b->bytes();
  for (const DeviceBuffer& b : owned_cache_) n += b.bytes();
  for (const auto& [steps, r] : runs_) n += r->times.bytes() + r->x_hist.bytes() + r->v_hist.bytes();
  return n;
}

}  // namespace alpamayo::ALP_CUDA_NS
