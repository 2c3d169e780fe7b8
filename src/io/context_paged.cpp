// Context::from_paged: a serving engine's page pools and block table as a KVCache of page tables, with the
// leading pages samples share found and bound as shared prompts (the cascade reads them once per step).
#include <algorithm>
#include <climits>
#include <map>

#include "alpamayo/context.h"
#include "alpamayo/error.h"

namespace alpamayo {

namespace {

std::vector<int64_t> strides_of(const TensorView& t) {
  if (!t.strides.empty()) return t.strides;
  std::vector<int64_t> s(t.shape.size(), 1);
  for (size_t i = t.shape.size(); i-- > 1;) s[i - 1] = s[i] * t.shape[i];
  return s;
}

// One pool of an engine's layout as the canonical view [num_pages, Hkv, page_size, d]: the same memory, other
// strides. `part` 0 or 1 picks K or V of a combined pool [num_pages, 2, ...]; -1: a pool of one of them.
TensorView canonical_pool(const TensorView& t, bool nhd, int part, const std::string& name) {
  const size_t rank = part < 0 ? 4 : 5;
  check(t.shape.size() == rank, ErrorCode::InvalidArgument,
        name + ": expected a page pool " + (part < 0 ? "" : "[num_pages, 2, ...] ") +
            (nhd ? "[num_pages, page_size, Hkv, d] (NHD)" : "[num_pages, Hkv, page_size, d] (HND)") + ", found " +
            shape_str(t.shape));
  check(part < 0 || t.shape[1] == 2, ErrorCode::InvalidArgument,
        name + ": a combined pool holds K and V in dimension 1 ([num_pages, 2, ...]), found " + shape_str(t.shape));
  check(t.strides.empty() || t.strides.size() == rank, ErrorCode::InvalidArgument,
        name + ": strides " + shape_str(t.strides) + " do not match shape " + shape_str(t.shape));
  const std::vector<int64_t> st = strides_of(t);
  const size_t o = part < 0 ? 0 : 1;  // the dims after the K/V one
  const size_t rows = nhd ? 1 + o : 2 + o, heads = nhd ? 2 + o : 1 + o;
  TensorView v;
  v.dtype = t.dtype;
  v.device = t.device;
  v.name = name;
  v.shape = {t.shape[0], t.shape[heads], t.shape[rows], t.shape[3 + o]};
  v.strides = {st[0], st[heads], st[rows], st[3 + o]};
  v.data = static_cast<const char*>(t.data) + (part > 0 ? st[1] * int64_t(dtype_size(t.dtype)) : 0);
  if (v.is_contiguous()) v.strides.clear();
  return v;
}

// The block table [B, max_pages] as int64 (host memory, any strides).
std::vector<int64_t> read_block_table(const TensorView& t, const std::string& n) {
  check(t.dtype == DType::I32 || t.dtype == DType::I64, ErrorCode::InvalidArgument,
        n + ": block_table must be int32 or int64, found " + dtype_name(t.dtype));
  check(t.shape.size() == 2 && t.shape[0] > 0 && t.shape[1] > 0, ErrorCode::InvalidArgument,
        n + ": block_table must be [B, max_pages] with B, max_pages >= 1, found " + shape_str(t.shape));
  check(t.device.host_accessible(), ErrorCode::Unsupported,
        n + ": block_table lives in " + t.device.str() + " memory; pass it in host memory");
  check(t.data != nullptr, ErrorCode::InvalidArgument, n + ": block_table has a null data pointer");
  const std::vector<int64_t> st = strides_of(t);
  std::vector<int64_t> out(size_t(t.shape[0] * t.shape[1]));
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t p = 0; p < t.shape[1]; ++p) {
      const int64_t i = b * st[0] + p * st[1];
      out[size_t(b * t.shape[1] + p)] = t.dtype == DType::I64 ? static_cast<const int64_t*>(t.data)[i]
                                                               : static_cast<const int32_t*>(t.data)[i];
    }
  return out;
}

// Samples grouped by a shared leading run of pages: for each sample its group, and for each group the whole pages
// all its samples share (0 for a sample alone). Samples are grouped by their first page, and the run is the
// longest common prefix of the group's tables over pages every one of them fills.
void find_shared_prompts(const std::vector<int64_t>& table, int64_t B, int64_t W, int ps,
                         const std::vector<int64_t>& valid_len, std::vector<int64_t>& prompt_of,
                         std::vector<int64_t>& shared_pages, std::vector<std::vector<int64_t>>& members) {
  std::map<int64_t, int64_t> by_first;  // first page -> group
  prompt_of.assign(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    const bool full_first = valid_len[size_t(b)] >= ps;
    auto it = full_first ? by_first.find(table[size_t(b * W)]) : by_first.end();
    if (it == by_first.end()) {
      it = by_first.end();
      members.push_back({});
      if (full_first) by_first[table[size_t(b * W)]] = int64_t(members.size()) - 1;
      prompt_of[size_t(b)] = int64_t(members.size()) - 1;
    } else {
      prompt_of[size_t(b)] = it->second;
    }
    members[size_t(prompt_of[size_t(b)])].push_back(b);
  }
  shared_pages.assign(members.size(), 0);
  for (size_t g = 0; g < members.size(); ++g) {
    if (members[g].size() < 2) continue;
    int64_t k = W;
    for (int64_t b : members[g]) k = std::min(k, valid_len[size_t(b)] / ps);
    for (int64_t p = 0; p < k; ++p)
      for (int64_t b : members[g])
        if (table[size_t(b * W + p)] != table[size_t(members[g][0] * W + p)]) k = std::min(k, p);
    shared_pages[g] = k;
  }
}

// Every page a sample reads (the pages of its valid_len rows) inside every pool; valid_len within the table.
void check_table(const std::vector<int64_t>& table, int64_t B, int64_t W, int ps, const std::vector<int64_t>& valid_len,
                 const KVCache& kv, const std::string& n) {
  check(int64_t(valid_len.size()) == B, ErrorCode::InvalidArgument,
        n + ": valid_len has " + std::to_string(valid_len.size()) + " entries, block_table " + std::to_string(B) +
            " rows");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = valid_len[size_t(b)];
    check(len >= 0 && len <= W * ps, ErrorCode::InvalidArgument,
          n + ": valid_len[" + std::to_string(b) + "] = " + std::to_string(len) + " needs more than the " +
              std::to_string(W) + " pages of " + std::to_string(ps) + " rows its block_table row holds");
    for (int64_t p = 0; p * ps < len; ++p) {
      const int64_t page = table[size_t(b * W + p)];
      for (const auto* list : {&kv.key, &kv.value})
        for (const TensorView& t : *list)
          check(page >= 0 && page < t.shape[0], ErrorCode::InvalidArgument,
                n + ": block_table[" + std::to_string(b) + ", " + std::to_string(p) + "] = " + std::to_string(page) +
                    " is outside the pool " + t.name + " of " + std::to_string(t.shape[0]) + " pages");
    }
  }
}

}  // namespace

Context Context::from_paged(std::vector<TensorView> key_pages, std::vector<TensorView> value_pages,
                            const TensorView& block_table, std::vector<int64_t> valid_len,
                            std::vector<int64_t> rope_delta, const std::string& layout,
                            std::optional<EgoHistory> history, std::optional<std::vector<float>> v0,
                            const std::string& name) {
  const std::string& n = name;
  check(layout == "NHD" || layout == "HND", ErrorCode::InvalidArgument,
        n + ": layout must be \"NHD\" ([num_pages, page_size, Hkv, d]) or \"HND\" ([num_pages, Hkv, page_size, d]), "
            "found \"" + layout + "\"");
  const size_t L = key_pages.size();
  check(L > 0, ErrorCode::InvalidArgument, n + ": key_pages has no layers");
  const bool combined = value_pages.empty();
  check(combined || value_pages.size() == L, ErrorCode::InvalidArgument,
        n + ": key_pages has " + std::to_string(L) + " layers, value_pages " + std::to_string(value_pages.size()));
  KVCache kv;
  for (size_t l = 0; l < L; ++l) {
    auto label = [&](const TensorView& t, const char* what) {
      return t.name.empty() ? n + ": " + what + "[" + std::to_string(l) + "]" : t.name;
    };
    const std::string kn = label(key_pages[l], "key_pages");
    kv.key.push_back(canonical_pool(key_pages[l], layout == "NHD", combined ? 0 : -1, kn));
    kv.value.push_back(combined ? canonical_pool(key_pages[l], layout == "NHD", 1, kn + " (values)")
                                : canonical_pool(value_pages[l], layout == "NHD", -1, label(value_pages[l], "value_pages")));
  }
  const TensorView& k0 = kv.key[0];
  for (const auto* list : {&kv.key, &kv.value})
    for (const TensorView& t : *list) {
      check(t.shape[1] == k0.shape[1], ErrorCode::InvalidArgument,
            t.name + ": " + std::to_string(t.shape[1]) + " KV heads, " + k0.name + " has " + std::to_string(k0.shape[1]));
      check(t.shape[2] == k0.shape[2] && t.shape[3] == k0.shape[3], ErrorCode::InvalidArgument,
            t.name + ": page size " + std::to_string(t.shape[2]) + " and head dim " + std::to_string(t.shape[3]) +
                ", " + k0.name + " has " + std::to_string(k0.shape[2]) + " and " + std::to_string(k0.shape[3]));
    }
  const int ps = static_cast<int>(k0.shape[2]);
  check(ps >= 1 && ps <= 256 && (ps & (ps - 1)) == 0, ErrorCode::InvalidArgument,
        k0.name + ": page size " + std::to_string(ps) + " is not a power of two from 1 to 256");
  const std::vector<int64_t> table = read_block_table(block_table, n);
  const int64_t B = block_table.shape[0], W = block_table.shape[1];
  check(B <= INT32_MAX && W * ps <= INT32_MAX, ErrorCode::InvalidArgument,
        n + ": block_table " + shape_str(block_table.shape) + " with pages of " + std::to_string(ps) +
            " rows is beyond 2^31 - 1 samples or rows");
  check_table(table, B, W, ps, valid_len, kv, n);
  kv.B = static_cast<int>(B);
  kv.Hkv = static_cast<int>(k0.shape[1]);
  kv.d = static_cast<int>(k0.shape[3]);
  kv.page_size = ps;
  kv.P = static_cast<int>(W * ps);
  std::vector<int64_t> prompt_of, shared;
  std::vector<std::vector<int64_t>> members;
  find_shared_prompts(table, B, W, ps, valid_len, prompt_of, shared, members);
  const bool sharing = std::any_of(shared.begin(), shared.end(), [](int64_t k) { return k > 0; });
  if (!sharing) {  // one prompt per sample: its whole table
    kv.G = kv.B;
    kv.prompt_pages = table;
    kv.valid_len = std::move(valid_len);
  } else {  // each group's shared pages as its prompt, the rest of each sample's pages as its suffix
    kv.G = static_cast<int>(members.size());
    kv.prompt_of = prompt_of;
    kv.Q = kv.P;
    kv.prompt_pages.assign(size_t(kv.G * W), -1);
    kv.suffix_pages.assign(size_t(B * W), -1);
    kv.valid_len.assign(size_t(kv.G), 0);
    kv.suffix_len.assign(size_t(B), 0);
    for (size_t g = 0; g < members.size(); ++g) {
      const int64_t first = members[g][0];
      const int64_t k = members[g].size() < 2 ? W : shared[g];  // a sample alone: all its pages are its prompt
      for (int64_t p = 0; p < k; ++p) kv.prompt_pages[g * W + p] = table[size_t(first * W + p)];
      kv.valid_len[g] = members[g].size() < 2 ? valid_len[size_t(first)] : k * ps;
      for (int64_t b : members[g]) {
        if (members[g].size() < 2) continue;
        for (int64_t p = k; p < W; ++p) kv.suffix_pages[size_t(b * W + p - k)] = table[size_t(b * W + p)];
        kv.suffix_len[size_t(b)] = valid_len[size_t(b)] - k * ps;
      }
    }
    kv.suffix_key = kv.key;
    kv.suffix_value = kv.value;
  }
  return from_views(std::move(kv), std::move(rope_delta), std::move(history), std::move(v0), name);
}

}  // namespace alpamayo
