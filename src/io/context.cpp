#include "alpamayo/context.h"

#include <climits>
#include <cmath>
#include <set>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "io/inputs.h"

namespace alpamayo {

void check_finite(const float* p, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(p[i]), ErrorCode::NonFinite,
          what + ": non-finite value " + std::to_string(p[i]) + " at flat index " + std::to_string(i));
}

namespace {

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& key, const std::vector<int64_t>& shape) {
  TensorView v = f.view(key);
  check(v.dtype == DType::F64 || is_float(v.dtype), ErrorCode::Format,
        v.name + ": expected F32 (F64/F16/BF16 accepted), found " + dtype_name(v.dtype));
  expect_shape(v, shape, ErrorCode::Format);
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
  check(v.dtype == DType::I64 || v.dtype == DType::I32, ErrorCode::Format,
        v.name + ": expected I64, found " + dtype_name(v.dtype));
  expect_shape(v, {B}, ErrorCode::Format);
  std::vector<int64_t> out(B);
  for (int64_t i = 0; i < B; ++i)
    out[i] = v.dtype == DType::I64 ? static_cast<const int64_t*>(v.data)[i] : static_cast<const int32_t*>(v.data)[i];
  return out;
}

// NaN/Inf scan of rows [lo[n], hi[n]) of each sequence n and head h of a cache view (the other rows are padding
// and may hold anything): in bulk where the view is dense and contiguous, else row by row through kv_row_offset.
void check_cache_finite(const KVCache& kv, const TensorView& t, bool suffix, const std::vector<int64_t>& lo,
                        const std::vector<int64_t>& hi) {
  const int64_t H = kv.Hkv, d = kv.d;
  const bool bulk = !kv.paged() && t.is_contiguous();
  for (size_t n = 0; n < lo.size(); ++n)
    for (int64_t h = 0; h < H; ++h) {
      int64_t bad_row = -1, bad_col = 0;
      if (bulk) {
        const int64_t base = kv_row_offset(kv, t, suffix, int(n), int(h), lo[n]);
        const int64_t i = first_non_finite(t, base, base + (hi[n] - lo[n]) * d);
        if (i >= 0) bad_row = lo[n] + (i - base) / d, bad_col = (i - base) % d;
      } else {
        for (int64_t r = lo[n]; r < hi[n] && bad_row < 0; ++r) {
          const int64_t i = first_non_finite(kv_row_view(kv, t, suffix, int(n), int(h), r));
          if (i >= 0) bad_row = r, bad_col = i;
        }
      }
      if (bad_row < 0) continue;  // the message below indexes the page table by bad_row
      check(false, ErrorCode::NonFinite,
            t.name + ": non-finite value at [" + std::to_string(n) + ", " + std::to_string(h) + ", " +
                std::to_string(bad_row) + ", " + std::to_string(bad_col) + "]" +
                (kv.paged() ? " (" + std::string(suffix ? "suffix" : "prompt") + " row " + std::to_string(bad_row) +
                                  " of " + (suffix ? "sample " : "prompt ") + std::to_string(n) + ", page " +
                                  std::to_string((suffix ? kv.suffix_pages : kv.prompt_pages)
                                                     [n * ((suffix ? kv.Q : kv.P) / kv.page_size) +
                                                      bad_row / kv.page_size]) +
                                  ")"
                            : std::string()));
    }
}

// Layer l's tensors "<prefix>{l}" for l < L; no other "<prefix>N" may exist.
std::vector<TensorView> layer_tensors(const SafetensorsFile& f, const std::string& prefix, int L) {
  for (const auto& [k, ti] : f.tensors()) {
    if (k.rfind(prefix, 0) != 0) continue;
    const std::string num = k.substr(prefix.size());
    const bool ok = !num.empty() && num.size() < 10 && num.find_first_not_of("0123456789") == std::string::npos &&
                    std::stoll(num) < L;
    check(ok, ErrorCode::Format,
          f.path() + ": tensor '" + k + "' does not belong to layers 0.." + std::to_string(L - 1) +
              " (layer indices must be contiguous and match key.{l})");
  }
  std::vector<TensorView> out;
  for (int l = 0; l < L; ++l) out.push_back(f.view(prefix + std::to_string(l)));
  return out;
}

// Device-resident caches are scanned by the backend that can read them (Session::bind refuses a cache no backend
// of the session can read); host caches here, once: the rows some sample attends to.
void check_rows_finite(const KVCache& kv) {
  std::vector<int64_t> lo(kv.G), hi(kv.valid_len);
  for (int g = 0; g < kv.G; ++g) lo[g] = kv.pad(g);
  for (size_t l = 0; l < kv.key.size(); ++l)
    for (const TensorView* t : {&kv.key[l], &kv.value[l]})
      if (t->device.host_accessible()) check_cache_finite(kv, *t, false, lo, hi);
  if (!kv.suffix_key.empty()) {
    const std::vector<int64_t> zero(kv.B, 0);
    for (size_t l = 0; l < kv.suffix_key.size(); ++l)
      for (const TensorView* t : {&kv.suffix_key[l], &kv.suffix_value[l]})
        if (t->device.host_accessible()) check_cache_finite(kv, *t, true, zero, kv.suffix_len);
  }
}

// A paged cache's page tables: page_size a power of two up to 256, P and Q whole pages, one table row per
// sequence, and every page some sample attends to inside every layer's pool.
void check_pages(const KVCache& kv, const std::string& n, ErrorCode bad) {
  const int ps = kv.page_size;
  check(ps >= 1 && ps <= 256 && (ps & (ps - 1)) == 0, bad,
        n + ": page size " + std::to_string(ps) + " is not a power of two from 1 to 256");
  check(kv.P % ps == 0 && kv.Q % ps == 0, bad,
        n + ": P = " + std::to_string(kv.P) + " and Q = " + std::to_string(kv.Q) + " must be whole pages of " +
            std::to_string(ps) + " rows");
  auto table = [&](const std::vector<int64_t>& pages, const char* what, int64_t seqs, int64_t width,
                   const std::vector<TensorView>& k, const std::vector<TensorView>& v, auto lo, auto hi) {
    check(int64_t(pages.size()) == seqs * width, bad,
          n + ": " + what + " has " + std::to_string(pages.size()) + " entries, expected " + std::to_string(seqs) +
              " x " + std::to_string(width));
    for (int64_t s = 0; s < seqs; ++s) {
      if (hi(s) <= lo(s)) continue;
      for (int64_t p = lo(s) / ps; p <= (hi(s) - 1) / ps; ++p) {
        const int64_t page = pages[size_t(s * width + p)];
        for (const auto* list : {&k, &v})
          for (const TensorView& t : *list)
            check(page >= 0 && page < t.shape[0], bad,
                  n + ": " + what + "[" + std::to_string(s) + ", " + std::to_string(p) + "] = " +
                      std::to_string(page) + " is outside the pool " + t.name + " of " +
                      std::to_string(t.shape[0]) + " pages");
      }
    }
  };
  table(kv.prompt_pages, "the prompt page table", kv.G, kv.P / ps, kv.key, kv.value,
        [&](int64_t g) { return kv.pad(int(g)); }, [&](int64_t g) { return kv.valid_len[size_t(g)]; });
  if (!kv.suffix_key.empty())
    table(kv.suffix_pages, "the suffix page table", kv.B, kv.Q / ps, kv.suffix_key, kv.suffix_value,
          [](int64_t) { return int64_t(0); }, [&](int64_t b) { return kv.suffix(int(b)); });
}

// The ego history of B samples: at least 2 poses, [B, H, 3] positions and [B, H, 3, 3] rotations, finite, in range.
void check_history(const EgoHistory& h, int64_t B, const std::string& n, ErrorCode bad) {
  const int64_t H = h.H;
  check(H >= 2, bad, n + ": ego_history_xyz needs at least 2 poses to estimate v0, found " + std::to_string(H));
  check(static_cast<int64_t>(h.xyz.size()) == B * H * 3, bad,
        n + ": ego_history_xyz has " + std::to_string(h.xyz.size()) + " values, expected [B=" +
            std::to_string(B) + ", H=" + std::to_string(H) + ", 3] = " + std::to_string(B * H * 3));
  check(static_cast<int64_t>(h.rot.size()) == B * H * 9, bad,
        n + ": ego_history_rot has " + std::to_string(h.rot.size()) + " values, expected [B=" +
            std::to_string(B) + ", H=" + std::to_string(H) + ", 3, 3] = " + std::to_string(B * H * 9));
  check_finite(h.xyz.data(), h.xyz.size(), n + ": ego_history_xyz");
  check_finite(h.rot.data(), h.rot.size(), n + ": ego_history_rot");
  for (size_t i = 0; i < h.xyz.size(); ++i)
    check(std::fabs(h.xyz[i]) <= limits::kMaxPosition, bad,
          n + ": ego_history_xyz" + index_str({B, H, 3}, static_cast<int64_t>(i)) + " = " +
              std::to_string(h.xyz[i]) + " m is beyond 1e7 m (positions are in the ego frame at t0)");
}

}  // namespace

Context Context::open(const std::string& path) {
  check_no_nul(path, "context");
  const StageScope stage("opening the context " + path);
  Context c;
  c.name_ = path;
  c.file_ = std::make_shared<SafetensorsFile>(path);
  const SafetensorsFile& f = *c.file_;
  int L = 0;
  while (f.contains("key." + std::to_string(L))) ++L;
  check(L > 0, ErrorCode::Format, path + ": missing tensor 'key.0' (a context needs key.{l} and value.{l} per layer)");
  KVCache& kv = c.kv_;
  kv.key = layer_tensors(f, "key.", L);
  kv.value = layer_tensors(f, "value.", L);
  const TensorView& k0 = kv.key[0];
  check(k0.shape.size() == 4, ErrorCode::Format,
        k0.name + ": expected shape [G, Hkv, P, d], found " + shape_str(k0.shape));
  for (int64_t s : k0.shape)
    check(s <= INT32_MAX, ErrorCode::Format,
          k0.name + ": shape " + shape_str(k0.shape) + " has a dimension beyond 2^31 - 1");
  kv.G = static_cast<int>(k0.shape[0]);
  kv.Hkv = static_cast<int>(k0.shape[1]);
  kv.P = static_cast<int>(k0.shape[2]);
  kv.d = static_cast<int>(k0.shape[3]);
  const int64_t G = kv.G;
  kv.valid_len = read_i64(f, "valid_len", G);
  if (f.contains("prefix_pad")) kv.prefix_pad = read_i64(f, "prefix_pad", G);
  int64_t B = G;
  if (f.contains("prompt_index")) {
    const TensorView pi = f.view("prompt_index");
    check(pi.shape.size() == 1 && pi.shape[0] > 0, ErrorCode::Format,
          pi.name + ": expected shape [B] with B >= 1, found " + shape_str(pi.shape));
    B = pi.shape[0];
    kv.prompt_of = read_i64(f, "prompt_index", B);
  }
  kv.B = static_cast<int>(B);
  if (!f.contains("prompt_index") && f.contains("rope_delta")) {
    const TensorView rd = f.view("rope_delta");
    check(rd.shape.size() != 1 || rd.shape[0] == G, ErrorCode::Format,
          path + ": rope_delta has " + std::to_string(rd.shape[0]) + " samples but the cache has G = " +
              std::to_string(G) + " prompts and no prompt_index naming each sample's prompt");
  }
  const bool sk = f.contains("suffix_key.0"), sl = f.contains("suffix_len");
  check(sk == sl, ErrorCode::Format,
        path + ": suffix_key.{l}/suffix_value.{l} and suffix_len must be given together (found only " +
            (sk ? "suffix_key.0" : "suffix_len") + ")");
  if (sk) {
    kv.suffix_key = layer_tensors(f, "suffix_key.", L);
    kv.suffix_value = layer_tensors(f, "suffix_value.", L);
    const TensorView& s0 = kv.suffix_key[0];
    check(s0.shape.size() == 4, ErrorCode::Format,
          s0.name + ": expected shape [B, Hkv, Q, d], found " + shape_str(s0.shape));
    kv.Q = static_cast<int>(s0.shape[2]);
    kv.suffix_len = read_i64(f, "suffix_len", B);
  }
  c.rope_delta_ = read_i64(f, "rope_delta", B);
  const bool hx = f.contains("ego_history_xyz"), hr = f.contains("ego_history_rot");
  check(hx == hr, ErrorCode::Format,
        path + ": ego_history_xyz and ego_history_rot must be given together (found only " +
            (hx ? "ego_history_xyz" : "ego_history_rot") + ")");
  if (hx) {
    const TensorView x = f.view("ego_history_xyz");
    check(x.shape.size() == 3 && x.shape[0] == B && x.shape[2] == 3, ErrorCode::Format,
          x.name + ": expected shape [" + std::to_string(B) + ", H, 3], found " + shape_str(x.shape));
    check(x.shape[1] <= INT32_MAX, ErrorCode::Format,
          x.name + ": " + std::to_string(x.shape[1]) + " poses is out of range");
    EgoHistory h;
    h.H = static_cast<int>(x.shape[1]);
    h.xyz = read_f32(f, "ego_history_xyz", {B, h.H, 3});
    h.rot = read_f32(f, "ego_history_rot", {B, h.H, 3, 3});
    c.history_ = std::move(h);
  }
  if (f.contains("v0")) c.v0_ = read_f32(f, "v0", {B});
  c.validate(ErrorCode::Format);
  return c;
}

Context Context::from_views(KVCache kv, std::vector<int64_t> rope_delta, std::optional<EgoHistory> history,
                            std::optional<std::vector<float>> v0, const std::string& name) {
  Context c;
  c.name_ = name;
  c.kv_ = std::move(kv);
  // One row set per sample unless the caller says otherwise.
  if (c.kv_.G == 0 && c.kv_.prompt_of.empty()) c.kv_.G = c.kv_.B;
  if (c.kv_.B == 0 && c.kv_.prompt_of.empty()) c.kv_.B = c.kv_.G;
  c.rope_delta_ = std::move(rope_delta);
  c.history_ = std::move(history);
  c.v0_ = std::move(v0);
  c.validate(ErrorCode::InvalidArgument);
  return c;
}

void Context::validate(ErrorCode bad) {
  KVCache& kv = kv_;
  const std::string& n = name_;
  check(kv.G > 0 && kv.B > 0 && kv.Hkv > 0 && kv.P > 0 && kv.d > 0, bad,
        n + ": empty KV cache dimensions (G=" + std::to_string(kv.G) + " B=" + std::to_string(kv.B) +
            " Hkv=" + std::to_string(kv.Hkv) + " P=" + std::to_string(kv.P) + " d=" + std::to_string(kv.d) + ")");
  check(!kv.key.empty(), bad, n + ": the KV cache has no layers");
  check(kv.key.size() == kv.value.size(), bad, n + ": key and value layer counts differ");
  // Dense views [N, Hkv, P, d]; page pools [num_pages, Hkv, page_size, d] (num_pages per view). Any strides with
  // the head dim's stride 1.
  auto check_layers = [&](const std::vector<TensorView>& list, std::vector<int64_t> shape) {
    for (const TensorView& t : list) {
      check(t.data != nullptr || t.numel() == 0, bad, t.name + ": null data pointer");
      expect_float(t, bad);
      if (kv.paged()) {
        shape[2] = kv.page_size;
        if (t.shape.size() == 4) shape[0] = t.shape[0];
        check(t.shape.size() == 4 && t.shape[0] > 0, bad,
              t.name + ": a page pool [num_pages, Hkv, page_size, d] needs num_pages >= 1, found " +
                  shape_str(t.shape));
      }
      expect_shape(t, shape, bad);
      const bool strides_ok = t.strides.empty() || (t.strides.size() == 4 && t.strides[3] == 1 && t.strides[0] >= 0 &&
                                                     t.strides[1] >= 0 && t.strides[2] >= 0);
      check(strides_ok, bad,
            t.name + ": cache views need strides of 4 non-negative elements with the head dim's stride 1 "
                     "(contiguous rows), found " +
                shape_str(t.strides));
    }
  };
  check_layers(kv.key, {kv.G, kv.Hkv, kv.P, kv.d});
  check_layers(kv.value, {kv.G, kv.Hkv, kv.P, kv.d});
  auto count = [&](const std::vector<int64_t>& v, int64_t want, const char* what, const char* dim) {
    check(static_cast<int64_t>(v.size()) == want, bad,
          n + ": " + what + " has " + std::to_string(v.size()) + " entries, expected " + dim + " = " +
              std::to_string(want));
  };
  count(kv.valid_len, kv.G, "valid_len", "G (prompts)");
  if (!kv.prefix_pad.empty()) count(kv.prefix_pad, kv.G, "prefix_pad", "G (prompts)");
  for (int g = 0; g < kv.G; ++g) {
    check(kv.valid_len[g] >= 0 && kv.valid_len[g] <= kv.P, bad,
          n + ": valid_len[" + std::to_string(g) + "] = " + std::to_string(kv.valid_len[g]) +
              " is outside [0, P = " + std::to_string(kv.P) + "]");
    check(kv.pad(g) >= 0 && kv.pad(g) <= kv.valid_len[g], bad,
          n + ": prefix_pad[" + std::to_string(g) + "] = " + std::to_string(kv.pad(g)) +
              " is outside [0, valid_len = " + std::to_string(kv.valid_len[g]) + "]");
  }
  if (kv.prompt_of.empty()) {
    check(kv.B == kv.G, bad,
          n + ": " + std::to_string(kv.B) + " samples but " + std::to_string(kv.G) +
              " prompts and no prompt_index naming each sample's prompt");
  } else {
    count(kv.prompt_of, kv.B, "prompt_index", "B (samples)");
    for (int b = 0; b < kv.B; ++b)
      check(kv.prompt_of[b] >= 0 && kv.prompt_of[b] < kv.G, bad,
            n + ": prompt_index[" + std::to_string(b) + "] = " + std::to_string(kv.prompt_of[b]) +
                " names no prompt (the cache holds G = " + std::to_string(kv.G) + ")");
  }
  const bool suffix = !kv.suffix_key.empty() || !kv.suffix_value.empty() || !kv.suffix_len.empty();
  if (suffix) {
    check(kv.suffix_key.size() == kv.key.size() && kv.suffix_value.size() == kv.key.size(), bad,
          n + ": suffix caches have " + std::to_string(kv.suffix_key.size()) + "/" +
              std::to_string(kv.suffix_value.size()) + " layers, the prompt caches " + std::to_string(kv.key.size()));
    check(kv.Q > 0, bad, n + ": suffix caches need Q >= 1 rows of capacity");
    check_layers(kv.suffix_key, {kv.B, kv.Hkv, kv.Q, kv.d});
    check_layers(kv.suffix_value, {kv.B, kv.Hkv, kv.Q, kv.d});
    count(kv.suffix_len, kv.B, "suffix_len", "B (samples)");
    for (int b = 0; b < kv.B; ++b)
      check(kv.suffix_len[b] >= 0 && kv.suffix_len[b] <= kv.Q, bad,
            n + ": suffix_len[" + std::to_string(b) + "] = " + std::to_string(kv.suffix_len[b]) +
                " is outside [0, Q = " + std::to_string(kv.Q) + "]");
  }
  if (kv.paged()) check_pages(kv, n, bad);
  count(rope_delta_, kv.B, "rope_delta", "B (samples)");
  for (int b = 0; b < kv.B; ++b) {
    const int64_t lim = int64_t(1) << 40;  // positions stay exact in fp32 rope arguments far below this
    check(rope_delta_[b] > -lim && rope_delta_[b] < lim, bad,
          n + ": rope_delta[" + std::to_string(b) + "] = " + std::to_string(rope_delta_[b]) +
              " is out of range (|rope_delta| < 2^40)");
  }
  check_rows_finite(kv);
  if (history_) check_history(*history_, kv.B, n, bad);
  if (v0_) {
    check(static_cast<int>(v0_->size()) == kv.B, bad,
          n + ": v0 has " + std::to_string(v0_->size()) + " values, the context has B = " + std::to_string(kv.B) +
              " samples");
    check_finite(v0_->data(), v0_->size(), n + ": v0");
  }
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
