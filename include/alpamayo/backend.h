// The backend seam. A backend receives one denoising step for the whole batch (all L layers and the
// final norm); host-side pieces (action_in_proj, action_out_proj, rope tables, sampler, action space)
// are shared by all backends. Every backend is tested against the reference backend.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/config.h"
#include "alpamayo/tensor.h"

namespace alpamayo {

// One layer's weights as stored in the checkpoint (F32, F16 or BF16), PyTorch layout [out, in].
struct LayerWeights {
  TensorView input_norm;  // [D]
  TensorView post_norm;   // [D]
  TensorView q, k, v;     // [Hq*d, D], [Hkv*d, D], [Hkv*d, D]
  TensorView o;           // [D, Hq*d]
  TensorView q_norm, k_norm;  // [d]
  TensorView gate, up;    // [I, D]
  TensorView down;        // [D, I]
};

struct ExpertWeights {
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // [D]
};

// The VLM's KV cache for one bound context. key[l], value[l]: [B, Hkv, P, d] (F32, F16 or BF16).
// The data must stay valid until the next bind() or the backend's destruction.
struct KVCache {
  int B = 0, Hkv = 0, P = 0, d = 0;
  std::vector<TensorView> key, value;
  std::vector<int64_t> valid_len;  // S_b, 0 <= S_b <= P
};

// Rotary tables for the expert tokens of each sample: cos/sin [B, T, d] (HF rotate_half layout).
struct RopeTables {
  int B = 0, T = 0, d = 0;
  std::vector<float> cos, sin;
};

// Called after each layer with its output hidden state [B, T, D] in fp32 (tests, --layers-out).
using LayerTap = std::function<void(int layer, const float* hidden)>;

struct BackendOptions {
  int threads = 0;                 // 0: all cores
  std::string weights = "bf16";    // weight storage of backends that pack (cpu): bf16 | int8
  bool profile = false;            // print a per-op time table (backends that support it)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Packs or uploads the weights once. The views stay valid for the backend's lifetime (the Engine keeps
  // the checkpoint alive), so a backend may also read them lazily, as the reference backend does.
  virtual void load(const ExpertConfig& cfg, const ExpertWeights& w) = 0;
  // Binds a context for subsequent steps; T (tokens per sample) comes from rope.T.
  // Allocates every persistent buffer (activations, scratch) for this batch and cache size.
  virtual void bind(const KVCache& kv, const RopeTables& rope) = 0;
  // One denoising step: emb [B, T, D] fp32 -> final-normed hidden [B, T, D] fp32.
  virtual void step(const float* emb, float* hidden, const LayerTap* tap = nullptr) = 0;
};

// "reference" (fp32, the oracle) or "cpu" (fast). Throws Error naming the unknown backend.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opts);
std::vector<std::string> backend_names();

}  // namespace alpamayo
