#include "alpamayo/context.h"

#include <climits>
#include <cmath>
#include <set>

#include "alpamayo/error.h"

namespace alpamayo {

void check_finite(const float* p, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(p[i]), what + ": non-finite value " + std::to_string(p[i]) + " at flat index " + std::to_string(i));
}

namespace {

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& key, const std::vector<int64_t>& shape) {
  TensorView v = f.view(key);
  check(v.dtype == DType::F64 || is_float(v.dtype), v.name + ": expected F32 (F64/F16/BF16 accepted), found " +
                                                        dtype_name(v.dtype));
  expect_shape(v, shape);
  if (v.dtype == DType::F64) {
    std::vector<float> out(v.numel());
    const double* p = static_cast<const double*>(v.data);
    for (int64_t i = 0; i < v.numel(); ++i) out[i] = static_cast<float>(p[i]);
    return out;
  }
  return to_f32(v);
}

std::vector<int64_t> read_i64(const SafetensorsFile& f, const std::string& key, int64_t B) {
  TensorView v = f.view(key);
  check(v.dtype == DType::I64 || v.dtype == DType::I32, v.name + ": expected I64, found " + dtype_name(v.dtype));
  expect_shape(v, {B});
  std::vector<int64_t> out(B);
  for (int64_t i = 0; i < B; ++i)
    out[i] = v.dtype == DType::I64 ? static_cast<const int64_t*>(v.data)[i] : static_cast<const int32_t*>(v.data)[i];
  return out;
}

// Index of the first NaN/Inf among n values of a float dtype, or -1. Tests the exponent bits only, so a
// full-size cache (1.2 GB) is scanned at memory speed.
int64_t first_non_finite(const void* p, DType t, int64_t n) {
  if (t == DType::F32) {
    const auto* u = static_cast<const uint32_t*>(p);
    for (int64_t i = 0; i < n; ++i)
      if ((u[i] & 0x7f800000u) == 0x7f800000u) return i;
  } else {
    const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
    const auto* u = static_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i)
      if ((u[i] & mask) == mask) return i;
  }
  return -1;
}

// NaN/Inf scan of the valid rows [0, S_b) of a [B, Hkv, P, d] cache tensor (padding rows may hold anything).
void check_cache_finite(const TensorView& t, const std::vector<int64_t>& valid) {
  const int64_t B = t.shape[0], H = t.shape[1], P = t.shape[2], d = t.shape[3];
  const size_t es = dtype_size(t.dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t i = first_non_finite(static_cast<const uint8_t*>(t.data) + (b * H + h) * P * d * es, t.dtype, valid[b] * d);
      check(i < 0, t.name + ": non-finite value at [" + std::to_string(b) + ", " + std::to_string(h) + ", " +
                       std::to_string(i / d) + ", " + std::to_string(i % d) + "]");
    }
}

}  // namespace

Context Context::open(const std::string& path) {
  Context c;
  c.name_ = path;
  c.file_ = std::make_shared<SafetensorsFile>(path);
  const SafetensorsFile& f = *c.file_;
  int L = 0;
  while (f.contains("key." + std::to_string(L))) ++L;
  check(L > 0, path + ": missing tensor 'key.0' (a context needs key.{l} and value.{l} per layer)");
  for (const auto& [k, ti] : f.tensors()) {
    if (k.rfind("key.", 0) == 0 || k.rfind("value.", 0) == 0) {
      const std::string num = k.substr(k.find('.') + 1);
      const bool ok = !num.empty() && num.size() <= 9 && num.find_first_not_of("0123456789") == std::string::npos &&
                      std::stoll(num) < L;
      check(ok, path + ": tensor '" + k + "' does not belong to layers 0.." + std::to_string(L - 1) +
                    " (layer indices must be contiguous)");
    }
  }
  const TensorView k0 = f.view("key.0");
  check(k0.shape.size() == 4, k0.name + ": expected shape [B, Hkv, P, d], found " + shape_str(k0.shape));
  for (int64_t s : k0.shape)
    check(s <= INT32_MAX, k0.name + ": shape " + shape_str(k0.shape) + " has a dimension beyond 2^31 - 1");
  KVCache& kv = c.kv_;
  kv.B = static_cast<int>(k0.shape[0]);
  kv.Hkv = static_cast<int>(k0.shape[1]);
  kv.P = static_cast<int>(k0.shape[2]);
  kv.d = static_cast<int>(k0.shape[3]);
  for (int l = 0; l < L; ++l) {
    kv.key.push_back(f.view("key." + std::to_string(l)));
    kv.value.push_back(f.view("value." + std::to_string(l)));
  }
  const int64_t B = kv.B;
  kv.valid_len = read_i64(f, "valid_len", B);
  c.rope_delta_ = read_i64(f, "rope_delta", B);
  const bool hx = f.contains("ego_history_xyz"), hr = f.contains("ego_history_rot");
  check(hx == hr, path + ": ego_history_xyz and ego_history_rot must be given together (found only " +
                      (hx ? "ego_history_xyz" : "ego_history_rot") + ")");
  if (hx) {
    const TensorView x = f.view("ego_history_xyz");
    check(x.shape.size() == 3 && x.shape[0] == B && x.shape[2] == 3,
          x.name + ": expected shape [" + std::to_string(B) + ", H, 3], found " + shape_str(x.shape));
    check(x.shape[1] <= INT32_MAX, x.name + ": " + std::to_string(x.shape[1]) + " poses is out of range");
    EgoHistory h;
    h.H = static_cast<int>(x.shape[1]);
    h.xyz = read_f32(f, "ego_history_xyz", {B, h.H, 3});
    h.rot = read_f32(f, "ego_history_rot", {B, h.H, 3, 3});
    c.history_ = std::move(h);
  }
  if (f.contains("v0")) c.v0_ = read_f32(f, "v0", {B});
  c.validate();
  return c;
}

Context Context::from_views(KVCache kv, std::vector<int64_t> rope_delta, std::optional<EgoHistory> history,
                            std::optional<std::vector<float>> v0, const std::string& name) {
  Context c;
  c.name_ = name;
  c.kv_ = std::move(kv);
  c.rope_delta_ = std::move(rope_delta);
  c.history_ = std::move(history);
  c.v0_ = std::move(v0);
  c.validate();
  return c;
}

void Context::validate() {
  const KVCache& kv = kv_;
  const std::string& n = name_;
  check(kv.B > 0 && kv.Hkv > 0 && kv.P > 0 && kv.d > 0, n + ": empty KV cache dimensions");
  check(kv.key.size() == kv.value.size(), n + ": key and value layer counts differ");
  const std::vector<int64_t> shape = {kv.B, kv.Hkv, kv.P, kv.d};
  for (size_t l = 0; l < kv.key.size(); ++l)
    for (const TensorView* t : {&kv.key[l], &kv.value[l]}) {
      expect_float(*t);
      expect_shape(*t, shape);
    }
  check(static_cast<int>(kv.valid_len.size()) == kv.B, n + ": valid_len has " + std::to_string(kv.valid_len.size()) +
                                                            " entries, the cache batch is " + std::to_string(kv.B));
  check(static_cast<int>(rope_delta_.size()) == kv.B, n + ": rope_delta has " + std::to_string(rope_delta_.size()) +
                                                           " entries, the cache batch is " + std::to_string(kv.B));
  for (int b = 0; b < kv.B; ++b) {
    check(kv.valid_len[b] >= 0 && kv.valid_len[b] <= kv.P,
          n + ": valid_len[" + std::to_string(b) + "] = " + std::to_string(kv.valid_len[b]) + " is outside [0, P = " +
              std::to_string(kv.P) + "]");
    check(rope_delta_[b] > -(int64_t(1) << 40) && rope_delta_[b] < (int64_t(1) << 40),  // no llabs: INT64_MIN
          n + ": rope_delta[" + std::to_string(b) + "] = " + std::to_string(rope_delta_[b]) + " is out of range");
  }
  for (size_t l = 0; l < kv.key.size(); ++l) {
    check_cache_finite(kv.key[l], kv.valid_len);
    check_cache_finite(kv.value[l], kv.valid_len);
  }
  if (history_) {
    check(history_->H >= 2, n + ": ego_history_xyz needs at least 2 poses to estimate v0, found " + std::to_string(history_->H));
    check_finite(history_->xyz.data(), history_->xyz.size(), n + ": ego_history_xyz");
    check_finite(history_->rot.data(), history_->rot.size(), n + ": ego_history_rot");
  }
  if (v0_) check_finite(v0_->data(), v0_->size(), n + ": v0");
}

void Context::check_compatible(const ExpertConfig& cfg) const {
  check(layers() == cfg.L, name_ + ": the context has " + std::to_string(layers()) +
                               " cache layers, the checkpoint's expert has " + std::to_string(cfg.L) +
                               " layers (expert layer l attends to VLM cache layer l)");
  check(kv_.Hkv == cfg.Hkv, name_ + ": key.0 has " + std::to_string(kv_.Hkv) + " KV heads, the expert has " +
                                std::to_string(cfg.Hkv));
  check(kv_.d == cfg.d, name_ + ": key.0 has head dim " + std::to_string(kv_.d) + ", the expert has " + std::to_string(cfg.d));
}

}  // namespace alpamayo
