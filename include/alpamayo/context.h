// What the VLM leaves for the expert: per-layer KV caches (G prompts stored once, optional per-sample
// suffixes), lengths, left padding, rope deltas and ego state. File format (safetensors, docs/FORMATS.md):
// key.{l}, value.{l} [G, Hkv, P, d] (BF16/F16/F32), valid_len [G] I64, optional prefix_pad [G] I64,
// optional prompt_index [B] I64, optional suffix_key.{l}, suffix_value.{l} [B, Hkv, Q, d] with
// suffix_len [B] I64, rope_delta [B] I64, optional ego_history_xyz [B, H, 3] and ego_history_rot
// [B, H, 3, 3] (F32) or v0 [B] (F32). A file without the optional tensors has G = B, as before.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/config.h"
#include "alpamayo/safetensors.h"

namespace alpamayo {

struct EgoHistory {
  int H = 0;
  std::vector<float> xyz;  // [B, H, 3]
  std::vector<float> rot;  // [B, H, 3, 3]
};

class Context {
 public:
  // Maps and validates a context file: every tensor's shape and dtype, lengths and indices in range, no
  // NaN/Inf in the cache rows some sample attends to or in the ego state. Throws Error naming the file
  // and the tensor: I/O when it cannot be read, format when it is malformed, non-finite for NaN/Inf.
  static Context open(const std::string& path);
  // Builds a context from caller-owned views (the embedding API); validated the same way. kv.G = 0 (and no
  // prompt_of) means one prompt per sample.
  static Context from_views(KVCache kv, std::vector<int64_t> rope_delta, std::optional<EgoHistory> history,
                            std::optional<std::vector<float>> v0, const std::string& name = "context");

  // Binds a serving engine's paged KV cache in place (docs/FORMATS.md has each engine's call). Per layer l,
  // key_pages[l] and value_pages[l] are page pools [num_pages, page_size, Hkv, d] (layout "NHD") or
  // [num_pages, Hkv, page_size, d] ("HND"), any strides with the head dim's stride 1; value_pages empty when each
  // key_pages[l] holds both as [num_pages, 2, ...] (K then V). block_table [B, max_pages] I32 or I64 in host
  // memory; valid_len [B] rows of each sample. Samples whose block tables start with the same pages (prefix caching,
  // several samples of one prompt) share them as one prompt, read once per step for all of them; the rest of each
  // sample's pages are its suffix. Validated as from_views, and every page a sample reads named when out of its pool.
  static Context from_paged(std::vector<TensorView> key_pages, std::vector<TensorView> value_pages,
                            const TensorView& block_table, std::vector<int64_t> valid_len,
                            std::vector<int64_t> rope_delta, const std::string& layout = "NHD",
                            std::optional<EgoHistory> history = std::nullopt,
                            std::optional<std::vector<float>> v0 = std::nullopt, const std::string& name = "context");

  // Throws unless the context fits the expert: same layer count, KV heads and head dim.
  void check_compatible(const ExpertConfig& cfg) const;

  const std::string& name() const { return name_; }
  int batch() const { return kv_.B; }
  int layers() const { return static_cast<int>(kv_.key.size()); }
  const KVCache& kv() const { return kv_; }
  const std::vector<int64_t>& rope_delta() const { return rope_delta_; }
  const std::optional<EgoHistory>& history() const { return history_; }
  const std::optional<std::vector<float>>& v0() const { return v0_; }

 private:
  // bad: the code of a structural failure (Format for a file, InvalidArgument for caller views); NaN/Inf is
  // always NonFinite.
  void validate(ErrorCode bad);
  std::string name_;
  std::shared_ptr<SafetensorsFile> file_;
  KVCache kv_;
  std::vector<int64_t> rope_delta_;
  std::optional<EgoHistory> history_;
  std::optional<std::vector<float>> v0_;
};

// Throws Error (non-finite) naming `what` if any of the n values is NaN or Inf.
void check_finite(const float* p, int64_t n, const std::string& what);

}  // namespace alpamayo
