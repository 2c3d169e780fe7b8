// The backend seam, at the level of a whole sample.
//
//   BackendModel   everything a sample needs (expert layers, final norm, action_in_proj, action_out_proj),
//                  converted, packed or uploaded once; immutable and shared by every session on it.
//   BackendSession one bound context: the cache views, rope tables, activations and scratch of one
//                  (batch, cache size); runs the whole denoising loop x_0 -> x_N in one call.
//
// The public Model / Session (model.h) are the non-virtual part: they validate every input once before a
// backend sees it, so backends assume valid input. Host backends that run one step at a time derive from
// HostLoopSession (src/backends/host_loop.h) and get the loop, the action projections and the captures;
// a device backend overrides denoise() and runs the loop on the device (one captured graph per bind).
// A backend is registered in src/backends/registry.cpp; the conformance suite then tests it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/config.h"
#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "alpamayo/weights.h"

namespace alpamayo {

// The VLM's KV cache for one bound context (docs/FORMATS.md, docs/MATH.md section 2): G prompt caches
// stored once, B samples each naming its prompt and optionally carrying suffix rows of its own (the
// reasoning text it generated after the shared prompt). Sample b attends to
//   prompt rows [prefix_pad[g], valid_len[g]) of prompt g = prompt(b)  (left padding masked)
//   ++ its suffix rows [0, suffix_len[b])  ++ its own T action tokens,
// and its expert tokens sit at rotary positions i + rope_delta_b + offset(b), offset(b) =
// valid_len[g] + suffix_len[b] (the index after its `<traj_future_start>` in the padded sequence).
// The common case, one cache row set per sample, is G = B, prompt(b) = b, no padding and no suffix.
// Tensors are F32, F16 or BF16 on any device a backend can read; the data must stay valid until the next
// bind() or the session's destruction.
struct KVCache {
  int B = 0, Hkv = 0, P = 0, d = 0;
  int G = 0;                                // prompts; key[l], value[l]: [G, Hkv, P, d]
  std::vector<TensorView> key, value;
  std::vector<int64_t> valid_len;           // [G] rows of each prompt's segment, <= P
  std::vector<int64_t> prefix_pad;          // [G] leading masked rows (left padding); empty: none
  std::vector<int64_t> prompt_of;           // [B] each sample's prompt; empty: sample b uses prompt b
  int Q = 0;                                // suffix capacity; suffix_key[l], suffix_value[l]: [B, Hkv, Q, d]
  std::vector<TensorView> suffix_key, suffix_value;  // empty: no suffixes
  std::vector<int64_t> suffix_len;          // [B] valid suffix rows; empty: none

  // Paged caches (vLLM, SGLang, FlashInfer, TensorRT-LLM; docs/FORMATS.md): page_size > 0 makes key[l], value[l]
  // (and suffix_key[l], suffix_value[l]) page pools [num_pages, Hkv, page_size, d], and prompt g's row i lies in
  // page prompt_pages[g * (P / page_size) + i / page_size], suffix row i of sample b in page
  // suffix_pages[b * (Q / page_size) + i / page_size], at row i % page_size. P and Q are multiples of page_size.
  // page_size is a power of two up to 256. Entries of pages no sample attends to are never read.
  int page_size = 0;
  std::vector<int64_t> prompt_pages, suffix_pages;
  // Every cache view may have any strides (in elements) with the head dim's stride 1: token-major caches and K and V
  // interleaved in one buffer are views with other strides; kv_row_offset resolves them.

  bool paged() const { return page_size > 0; }
  int prompt(int b) const { return prompt_of.empty() ? b : static_cast<int>(prompt_of[b]); }
  int64_t pad(int g) const { return prefix_pad.empty() ? 0 : prefix_pad[g]; }
  int64_t suffix(int b) const { return suffix_len.empty() ? 0 : suffix_len[b]; }
  // Rows of the padded sequence before sample b's action tokens: its rotary position offset.
  int64_t offset(int b) const { return valid_len[prompt(b)] + suffix(b); }
  // Cache rows sample b attends to (prompt rows after the padding, then its suffix).
  int64_t attended(int b) const { return valid_len[prompt(b)] - pad(prompt(b)) + suffix(b); }
};

// The one place a cache row becomes an address: the element offset from t.data of row i (0 <= i < P, or < Q for a
// suffix view) of head h of sequence n (prompt n of key/value, sample n of suffix_key/suffix_value) in cache view t
// of kv, for the dense [N, Hkv, P, d] views and the page pools alike, with t's strides.
inline int64_t kv_row_offset(const KVCache& kv, const TensorView& t, bool suffix, int n, int h, int64_t i) {
  const int64_t s0 = t.strides.empty() ? t.shape[1] * t.shape[2] * t.shape[3] : t.strides[0];
  const int64_t s1 = t.strides.empty() ? t.shape[2] * t.shape[3] : t.strides[1];
  const int64_t s2 = t.strides.empty() ? t.shape[3] : t.strides[2];
  if (!kv.paged()) return n * s0 + h * s1 + i * s2;
  const std::vector<int64_t>& pages = suffix ? kv.suffix_pages : kv.prompt_pages;
  const int64_t width = (suffix ? kv.Q : kv.P) / kv.page_size;
  const int64_t page = pages[size_t(n * width + i / kv.page_size)];
  return page * s0 + h * s1 + (i % kv.page_size) * s2;
}

// That row as a one-dimensional view of d elements, on t's device, without t's name.
inline TensorView kv_row_view(const KVCache& kv, const TensorView& t, bool suffix, int n, int h, int64_t i) {
  TensorView r;
  r.dtype = t.dtype;
  r.shape = {t.shape[3]};
  r.data = static_cast<const char*>(t.data) + kv_row_offset(kv, t, suffix, n, h, i) * int64_t(dtype_size(t.dtype));
  r.device = t.device;
  return r;
}

// Rotary tables for the expert tokens of each sample: cos/sin [B, T, d] (HF rotate_half layout), host fp32.
struct RopeTables {
  int B = 0, T = 0, d = 0;
  std::vector<float> cos, sin;
};

// Debug captures, requested at bind and read back after a run (never callbacks during it).
struct CaptureRequest {
  int step = -1;        // the Euler step to capture; -1: none
  bool layers = true;   // also every layer's output hidden state (else only emb and the final hidden)
};

struct Captures {
  int step = -1;                            // the step captured by the last run; -1: none
  std::vector<float> emb;                   // [B, T, D] input of the layers (action_in_proj output)
  std::vector<float> hidden;                // [B, T, D] final-normed output
  std::vector<std::vector<float>> layers;   // L x [B, T, D] outputs of each layer (when requested)
};

// What a session binds. Everything here has been validated against the model (model.h).
// With classifier-free guidance (NVlabs/alpamayo1.5 FlowMatching._guided_v) every step also runs the
// expert over the unguided context and uses v = (1 - w) v_unguided + w v_guided.
struct Binding {
  KVCache kv;
  RopeTables rope;
  CaptureRequest capture;   // captures the guided pass
  bool guided = false;
  KVCache unguided_kv;      // same B and layer count as kv
  RopeTables unguided_rope;
  double guidance_weight = 1.0;
};

// One whole sample. Host arrays; x holds x_0 on entry and x_N on return.
struct DenoiseArgs {
  float* x = nullptr;             // [B, T, A]
  const float* times = nullptr;   // [steps + 1], times[0] = 0, times[steps] = 1
  int steps = 0;
  float* x_steps = nullptr;       // optional [steps + 1, B, T, A]
  float* v_steps = nullptr;       // optional [steps, B, T, A]
  std::vector<double>* step_seconds = nullptr;  // filled with per-step wall times where the backend can
};

struct BackendOptions {
  int threads = 0;          // 0: all cores (host backends)
  std::string weights;      // weight format; empty: the backend's default (its first format)
  std::string kv;           // KV cache format (BackendInfo::kv_formats); empty: the backend's default (its first)
  bool profile = false;     // record a per-op profile of every step (backends that support it; Session::profiles)
  bool exact_freqs = false; // unrounded Fourier frequencies when the checkpoint has no buffers
  // Backends that choose kernels at load (BackendInfo::kernel_choices): the kernels to use, "op=kernel,..." as
  // BackendModel::kernels() reports them. The cpu backend: instead of timing; docs/CPU_BACKEND.md. The cuda backend:
  // its weight matmuls, "gemm=cublaslt" or "gemm=own" (default: cublaslt for bf16, own for fp8);
  // docs/CUDA_BACKEND.md. Empty: each backend's default. Programs fill it from ALPAMAYO_CPU_KERNELS /
  // ALPAMAYO_CUDA_GEMM when not given (options_from_environment, alpamayo/environment.h).
  // Results match bit for bit across processes and runs only where the kernels do. An error for other backends.
  std::string kernels;
  // The cpu backend: the instruction sets this model's kernels may use ("avx2", "avx2_vnni", "avx512",
  // "avx512_vnni", "avx512_bf16", "amx", "all"; docs/CPU_BACKEND.md); empty: all this CPU has. Filled from
  // ALPAMAYO_CPU_ISA when not given. Ignored by other backends.
  std::string isa_cap;
  // Where kernels and isa_cap came from, for messages: "" for the option, else the variable that filled it.
  std::string kernels_source, isa_cap_source;
  // The cuda backend: run each sample as one captured CUDA graph (false: the same launches, eagerly).
  bool graphs = true;
  // The cuda backend: the cuBLASLt library to load (a path, or a file name the dynamic loader searches for);
  // empty: the one already loaded, else libcublasLt.so.<major> (docs/CUDA_BACKEND.md). One per process.
  std::string cublaslt_path;
  // Block weight formats (bfp8_b, bfp4_b) only: weight matrices kept in bf16 instead, any of "qkv", "o", "gate",
  // "up", "down" (the device tensors wqkv, wo, w1, w3, w2). Default (empty): every matrix in the block format, as
  // the seed's Blackhole port holds them. Norms and the host action projections are never block-quantised.
  std::vector<std::string> bf16_weights;
};

// A non-finite velocity, with the first stage of the step that produced a non-finite value: the backend
// names the stage (action_in_proj, layer l, final norm, action_out_proj, the guidance mix); the Session adds
// the tensors of that stage that hold the largest or non-finite values.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& msg, int step, int layer, std::vector<float> input = {}, bool unguided = false)
      : Error(ErrorCode::NonFinite, msg), step(step), layer(layer), input(std::move(input)), unguided(unguided) {}
  int step;                  // the Euler step
  int layer;                 // the first layer whose output is non-finite; -1 when the stage is not a layer
  std::vector<float> input;  // that layer's (finite) input [B, T, D], when a layer is named
  bool unguided;             // found in the unguided pass of classifier-free guidance
};

// The profile of one run of the expert's layers (one Euler step, or its unguided pass), recorded where
// BackendOptions::profile is on and the backend profiles (the cpu backend); read back with Session::profiles().
// Numbers only: tools/ and bench/ print it as the --profile table.
struct ProfilePhase {
  std::string name;     // "rms_norm", "qkv matmul", ... in the order a layer runs them
  double seconds = 0;   // over all layers of the step
  double idle = 0;      // the threads' mean share of it spent waiting at its barriers, in [0, 1]
};
// The kernel chosen for an op at load, and why (docs/CPU_BACKEND.md, "Kernels chosen at run time").
struct ProfileKernel {
  std::string op, kernel, why;
  double rate = 0;            // measured at the choice, in `unit`; 0: not timed
  std::string unit;           // "GFLOP/s", or "GOP/s" for int8 weights
  std::string instruction;    // the instruction doing its multiply-adds; "" where none is recorded
  std::string check;          // the accuracy check at the choice; "" where nothing was checked
};
// An op's work in the step against the measured peak of the instruction its kernel multiplies with.
struct ProfileOp {
  std::string op, kernel, instruction;
  double gflop = 0;      // work per step (GOP for int8)
  double peak = 0;       // GFLOP/s (GOP/s) of the instruction, all threads
  double floor_ms = 0;   // per phase max(compute_ms, memory_ms), summed over the op's phases
  double actual_ms = 0;  // the op's phases in this step; 0: not measured
  double gbytes = 0;     // GB the op must move per step (weights, cache rows, activations)
  double read_gbs = 0;   // the measured streaming read bandwidth, GB/s, all threads
  double compute_ms = 0; // gflop / peak
  double memory_ms = 0;  // gbytes / read_gbs
  // GFLOP/s (GOP/s) reached in this step; 0 where not measured.
  double achieved() const { return actual_ms > 0 ? gflop / (1e-3 * actual_ms) : 0; }
};
struct StepProfile {
  std::string weights;             // the weight format
  int threads = 0, B = 0, T = 0, L = 0;
  int64_t s_max = 0;               // the most cache rows a sample attends to
  std::vector<ProfilePhase> phases;
  double wall_seconds = 0;         // the whole step, as the caller saw it
  std::string isa;                 // the instruction sets in use
  std::vector<ProfileKernel> kernels;
  std::string kernel_pin;          // the ALPAMAYO_CPU_KERNELS value that forces these choices
  std::vector<ProfileOp> ops;      // the weight matmuls, then attention
  int peak_threads = 0;            // the threads the peaks were measured on
};

class BackendSession {
 public:
  virtual ~BackendSession() = default;
  // Allocates every buffer for this batch and cache size; may be called again with other sizes.
  virtual void bind(const Binding& b) = 0;
  virtual void denoise(const DenoiseArgs& a) = 0;
  // The captures of the last denoise (step -1 when none were requested).
  virtual const Captures& captures() const = 0;
  // Bytes this session holds for its own buffers (activations, scratch, converted caches).
  virtual size_t buffer_bytes() const = 0;
  // The profiles of the last denoise, one per run of the layers in the order they ran (with guidance each step's
  // guided pass, then its unguided one); empty where profiling is off or the backend does not profile.
  virtual const std::vector<StepProfile>& profiles() const {
    static const std::vector<StepProfile> none;
    return none;
  }
};

class BackendModel {
 public:
  virtual ~BackendModel() = default;
  virtual std::string name() const = 0;
  virtual std::string weights() const = 0;  // the weight format in use
  // Whether this backend's sessions can read a tensor living on `dev` without a copy by the caller.
  virtual bool can_read(const Device& dev) const { return dev.host_accessible(); }
  // A new session; thread-compatible: sessions of one model may run concurrently in different threads.
  virtual std::unique_ptr<BackendSession> new_session() const = 0;
  // Bytes held by the model (packed or converted weights), not counting the checkpoint's mapping.
  virtual size_t weight_bytes() const = 0;
  // The kernels chosen at load, "op=kernel,..." (BackendOptions::kernels pins them); "" where there is no choice.
  virtual std::string kernels() const { return ""; }
};

// The context features a backend runs (KVCache above). Each is off unless the backend declares it: Session::bind
// refuses a context that needs an undeclared one, once, naming the backend and the feature, before the backend
// sees it; the conformance suite runs a backend on exactly the cases its declaration allows and lists the rest
// as skipped with the feature.
struct BackendFeatures {
  bool shared_prompts = false;  // G < B or prompt_of not the identity: samples that name one stored prompt
  bool suffix_rows = false;     // per-sample suffix caches (suffix_key / suffix_value)
  bool left_padding = false;    // prefix_pad with a row > 0
  bool guidance = false;        // classifier-free guidance (Binding::guided)
  bool device_memory = false;   // reads caches that live in GPU memory in place (BackendModel::can_read says which)
  bool strided_cache = false;   // cache views that are not row-major contiguous [N, Hkv, P, d] (kv_row_offset)
  bool paged_cache = false;     // page pools with page tables (KVCache::page_size), the pools with any strides
  // A non-finite velocity is traced to the first layer whose output is non-finite (NonFiniteError::layer), which
  // Session::sample then explains (the stage and the tensors); else only the step is named.
  bool traces_non_finite = false;
  // Splits its work over BackendOptions::threads host threads (with results bitwise independent of their number);
  // a device backend ignores the option.
  bool host_threads = false;
  // The largest batch B for a config; empty: no limit besides memory.
  std::function<int64_t(const ExpertConfig&)> max_batch;
};

// The features a context needs, by name ("shared prompts", "suffix rows", "left padding", "strided cache views",
// "paged caches"), in that order; a
// context needs none of them when every sample has a prompt of its own, no suffix and no padding.
std::vector<std::string> context_features(const KVCache& kv);
// "" when `f` allows every feature of kv (and guidance where `guided`) and B within max_batch, else the first
// one missing, as a phrase ("shared prompts", "classifier-free guidance", "a batch of 7 (at most 4 here)").
std::string missing_feature(const BackendFeatures& f, const ExpertConfig& c, const KVCache& kv, bool guided);

// A memory estimate: total bytes and what they are, for messages ("1.2 GiB: weights converted to f32
// 0.9 GiB, activations 0.3 GiB"). limits.h estimates and checks it.
struct MemoryEstimate {
  double bytes = 0;
  std::string parts;
  void add(const std::string& what, double b);
};

// Host memory a backend needs beyond what every host session holds (limits.h adds that), for the memory checks
// made before anything is allocated. Empty functions: nothing beyond it.
struct BackendMemory {
  // Bytes per weight of an expert layer's matrices in `format` held in host memory (0: none, e.g. uploaded to a
  // device, or converted one layer at a time).
  std::function<double(const std::string& format)> host_bytes_per_weight;
  // Adds to `e` the session's own host buffers that depend on the backend (converted caches, fp32 copies of a
  // layer), each named.
  std::function<void(MemoryEstimate& e, const ExpertConfig&, const KVCache& kv, const KVCache* unguided)> session;
};

// A registered backend: its name, its weight formats (the first is the default), its loader, and a probe
// that says why it cannot run on this machine (empty: it can), e.g. a GPU backend built where no GPU is.
// Everything the engine and the tests know about a backend comes from here: no code outside a backend's folder
// switches on its name.
struct BackendInfo {
  std::string name;
  std::vector<std::string> weight_formats;
  // The formats its sessions hold the KV cache in (BackendOptions::kv; the first is the default): "bf16", "f32",
  // "int8" (per-row int8, src/backends/kv_int8.h). Model::load checks the choice; backends assume it valid.
  std::vector<std::string> kv_formats;
  std::function<std::unique_ptr<BackendModel>(const ExpertConfig&, const ModelWeights&, const BackendOptions&)> load;
  std::function<std::string()> unavailable = [] { return std::string(); };
  // Where the machine decides which weight formats run (the cuda backend: fp8 needs an sm_89+ GPU): "" when
  // `format` runs here, else why. Asked only where unavailable() is empty; `backends` lists what runs here.
  std::function<std::string(const std::string& format)> format_unavailable = [](const std::string&) {
    return std::string();
  };
  bool kernel_choices = false;  // chooses kernels at load, and takes BackendOptions::kernels
  // The environment variable that pins its kernels at the programs' boundary (options_from_environment,
  // alpamayo/environment.h) and the op its value names: with kernels_variable_op "gemm", ALPAMAYO_CUDA_GEMM=own
  // pins "gemm=own"; with none, the value is the whole "op=kernel,..." list. Empty: no such variable.
  std::string kernels_variable, kernels_variable_op;
  BackendFeatures features;
  BackendMemory memory;
};

// Every backend compiled into this build, then those the program registered, in order of preference (the first
// is the default).
const std::vector<BackendInfo>& registered_backends();
// Adds a backend that is not built into the library (a test-only backend, an application's own). Call it before
// anything lists or loads a backend (a static initializer of the program, or the start of main); not thread-safe.
// Throws Error if backends were already listed or the name is taken.
void register_backend(BackendInfo info);
std::vector<std::string> backend_names();
// Throws Error naming the unknown backend and listing the known ones.
const BackendInfo& find_backend(const std::string& name);

}  // namespace alpamayo
