// Serving engines' caches bound in place: strided dense views (token-major, K and V interleaved in one buffer) and
// paged pools (NHD and HND, K and V split or combined, page sizes 1 to 256, one pool for all layers), against the
// dense binding of the same rows: bitwise on every backend that declares both (reference, cpu under every attention
// kernel this CPU runs with bf16 and int8 KV, cuda, and the emulated cuda_emu at page size 16 only). Pages samples share become a shared prompt (the cascade), bitwise equal to the dense binding
// that expresses the same sharing through prompt_of and suffix rows. Unused pages, the tails of partial pages and
// the block table past each sample's pages hold NaN or garbage, so a read of any of them fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/error.h"
#include "conformance_util.h"
#include "test_util.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/attention/attention.h"
#endif

namespace alpamayo {
namespace {

using namespace conformance;
using namespace test;

// The weights' shape (its context spec is unused): GQA 2:1, head dim 32, T = 8.
Shape paged_shape(DType cache) {
  return {"paged", 2, 64, 4, 2, 32, 128, 8, {1, {1}, {0}}, DType::BF16, cache, 2};
}

void put(DType dt, void* base, int64_t i, float v) {
  if (dt == DType::F32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
}

// B samples' cache rows: sample b has len[b] rows, of which the first shared_rows[group[b]] are its group's
// (the same values for every member); the rest are its own. value(l, kv, b, h, i)[c] gives each.
struct Rows {
  int L = 2, Hkv = 2, d = 32;
  std::vector<int> group;             // [B]
  std::vector<int64_t> shared_rows;   // [groups]
  std::vector<int64_t> len;           // [B]
  std::vector<float> own, common;     // [L][2][B or groups][Hkv][rows][d]
  int64_t max_rows = 0;
  int B() const { return static_cast<int>(len.size()); }
  int G() const { return static_cast<int>(shared_rows.size()); }
  const float* value(int l, int kv, int b, int h, int64_t i) const {
    const int g = group[b];
    if (i < shared_rows[g]) return &common[((((size_t(l) * 2 + kv) * G() + g) * Hkv + h) * max_rows + i) * d];
    return &own[((((size_t(l) * 2 + kv) * B() + b) * Hkv + h) * max_rows + i) * d];
  }
  static Rows make(std::vector<int> group, std::vector<int64_t> shared_rows, std::vector<int64_t> len, uint64_t seed) {
    Rows r;
    r.group = std::move(group);
    r.shared_rows = std::move(shared_rows);
    r.len = std::move(len);
    r.max_rows = *std::max_element(r.len.begin(), r.len.end());
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    r.own.resize(size_t(r.L) * 2 * r.B() * r.Hkv * r.max_rows * r.d);
    r.common.resize(size_t(r.L) * 2 * r.G() * r.Hkv * r.max_rows * r.d);
    for (float& x : r.own) x = n(rng);
    for (float& x : r.common) x = n(rng);
    return r;
  }
};

using Store = std::deque<std::vector<uint8_t>>;

void* alloc(Store& st, size_t elems, DType dt, float fill) {
  std::vector<uint8_t>& v = st.emplace_back(elems * dtype_size(dt));
  for (size_t i = 0; i < elems; ++i) put(dt, v.data(), int64_t(i), fill);
  return v.data();
}

// The dense binding: without sharing, one prompt [B, Hkv, P, d] per sample; with it, each group's shared rows as
// its prompt (a sample alone: all its rows) and each member's other rows as its suffix [B, Hkv, Q, d]. P and Q as
// the paged binding has them. Rows past the lengths hold NaN.
Context dense_context(const Rows& r, DType dt, bool sharing, int64_t P, Store& st) {
  KVCache kv;
  kv.B = r.B(), kv.Hkv = r.Hkv, kv.d = r.d, kv.P = static_cast<int>(P);
  std::vector<int> members(r.G(), 0);
  for (int b = 0; b < r.B(); ++b) ++members[r.group[b]];
  auto prompt_rows = [&](int g, int first) { return members[g] > 1 ? r.shared_rows[g] : r.len[first]; };
  std::vector<int> first(r.G(), -1);
  for (int b = 0; b < r.B(); ++b)
    if (first[r.group[b]] < 0) first[r.group[b]] = b;
  kv.G = sharing ? r.G() : r.B();
  if (sharing) {
    kv.Q = kv.P;
    for (int b = 0; b < r.B(); ++b) kv.prompt_of.push_back(r.group[b]);
    for (int g = 0; g < r.G(); ++g) kv.valid_len.push_back(prompt_rows(g, first[g]));
    for (int b = 0; b < r.B(); ++b)
      kv.suffix_len.push_back(members[r.group[b]] > 1 ? r.len[b] - r.shared_rows[r.group[b]] : 0);
  } else {
    kv.valid_len = r.len;
  }
  const size_t d = r.d;
  for (int l = 0; l < r.L; ++l)
    for (int k = 0; k < 2; ++k) {
      void* p = alloc(st, size_t(kv.G) * r.Hkv * P * d, dt, NAN);
      for (int n = 0; n < kv.G; ++n)
        for (int h = 0; h < r.Hkv; ++h)
          for (int64_t i = 0; i < kv.valid_len[n]; ++i) {
            const int b = sharing ? first[n] : n;
            for (size_t c = 0; c < d; ++c)
              put(dt, p, int64_t((((size_t(n) * r.Hkv + h) * P + i) * d) + c), r.value(l, k, b, h, i)[c]);
          }
      (k ? kv.value : kv.key).push_back({dt, {kv.G, r.Hkv, P, int64_t(d)}, p, (k ? "value." : "key.") + std::to_string(l)});
      if (!sharing) continue;
      void* s = alloc(st, size_t(r.B()) * r.Hkv * P * d, dt, NAN);
      for (int b = 0; b < r.B(); ++b)
        for (int h = 0; h < r.Hkv; ++h)
          for (int64_t i = 0; i < kv.suffix_len[b]; ++i)
            for (size_t c = 0; c < d; ++c)
              put(dt, s, int64_t((((size_t(b) * r.Hkv + h) * P + i) * d) + c),
                  r.value(l, k, b, h, i + r.len[b] - kv.suffix_len[b])[c]);
      (k ? kv.suffix_value : kv.suffix_key)
          .push_back({dt, {r.B(), r.Hkv, P, int64_t(d)}, s, (k ? "suffix_value." : "suffix_key.") + std::to_string(l)});
    }
  return Context::from_views(kv, std::vector<int64_t>(r.B(), -3), std::nullopt, std::vector<float>(r.B(), 4.f),
                             "dense");
}

struct PagedSpec {
  int page_size = 16;
  bool nhd = true, combined = false, i64_table = true;
  int holes = 3;  // unused pages (NaN) spread through the pool
};

// The same rows as a paged cache: one pool for all layers ([L, num_pages, ...], each layer a view at its layer
// stride), pages in a shuffled order with holes, shared pages stored once, the block table's unused entries
// garbage. Returns the context from_paged builds; *width gets the block table's width.
Context paged_context(const Rows& r, DType dt, const PagedSpec& ps, Store& st, int64_t* width, uint64_t seed) {
  const int64_t S = ps.page_size, d = r.d, H = r.Hkv;
  std::vector<int> members(r.G(), 0);
  for (int b = 0; b < r.B(); ++b) ++members[r.group[b]];
  // Logical pages: each shared group's pages once, then every sample's own pages.
  std::vector<std::vector<int64_t>> logical(r.B());  // per sample, logical page ids
  int64_t next = 0;
  std::vector<int64_t> group_first(r.G(), -1);
  for (int b = 0; b < r.B(); ++b) {
    const int g = r.group[b];
    const int64_t shared = members[g] > 1 ? r.shared_rows[g] / S : 0;
    if (shared > 0 && group_first[g] < 0) {
      group_first[g] = next;
      next += shared;
    }
    for (int64_t p = 0; p < shared; ++p) logical[b].push_back(group_first[g] + p);
    for (int64_t p = shared; p * S < r.len[b]; ++p) logical[b].push_back(next++);
  }
  const int64_t N = next + ps.holes;
  std::vector<int64_t> perm(N);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t W = 1;
  for (const auto& pages : logical) W = std::max<int64_t>(W, int64_t(pages.size()) + 1);
  *width = W;
  // The pool's element strides: [L][N][(2)][rows, heads or heads, rows][d].
  const int64_t parts = ps.combined ? 2 : 1, page_elems = S * H * d;
  const int64_t s_row = ps.nhd ? H * d : d, s_head = ps.nhd ? d : S * d, s_part = page_elems,
                s_page = parts * page_elems, s_layer = N * s_page;
  std::vector<void*> pools;
  for (int k = 0; k < (ps.combined ? 1 : 2); ++k) pools.push_back(alloc(st, size_t(r.L * s_layer), dt, NAN));
  for (int l = 0; l < r.L; ++l)
    for (int k = 0; k < 2; ++k)
      for (int b = 0; b < r.B(); ++b)
        for (int64_t i = 0; i < r.len[b]; ++i) {
          const int64_t page = perm[logical[b][i / S]];
          for (int h = 0; h < H; ++h) {
            const int64_t base = l * s_layer + page * s_page + (ps.combined ? k * s_part : 0) + h * s_head +
                                 (i % S) * s_row;
            for (int64_t c = 0; c < d; ++c)
              put(dt, pools[ps.combined ? 0 : k], base + c, r.value(l, k, b, h, i)[c]);
          }
        }
  std::vector<TensorView> keys, values;
  const std::vector<int64_t> page_shape =
      ps.nhd ? std::vector<int64_t>{N, S, H, d} : std::vector<int64_t>{N, H, S, d};
  for (int l = 0; l < r.L; ++l) {
    if (ps.combined) {
      TensorView t{dt, {N, 2, page_shape[1], page_shape[2], d}, static_cast<const char*>(pools[0]) +
                   l * s_layer * int64_t(dtype_size(dt)), "kv_pages." + std::to_string(l)};
      keys.push_back(t);
      continue;
    }
    for (int k = 0; k < 2; ++k)
      (k ? values : keys)
          .push_back({dt, page_shape, static_cast<const char*>(pools[k]) + l * s_layer * int64_t(dtype_size(dt)),
                      (k ? "value_pages." : "key_pages.") + std::to_string(l)});
  }
  std::vector<int64_t> table(size_t(r.B() * W), 0);
  for (int b = 0; b < r.B(); ++b)
    for (int64_t p = 0; p < W; ++p)
      table[size_t(b * W + p)] = p < int64_t(logical[b].size()) ? perm[logical[b][p]] : (p % 2 ? -7 : N + 100);
  TensorView bt;
  bt.shape = {r.B(), W};
  if (ps.i64_table) {
    auto& bytes = st.emplace_back(table.size() * 8);
    std::memcpy(bytes.data(), table.data(), bytes.size());
    bt.dtype = DType::I64, bt.data = bytes.data();
  } else {
    auto& bytes = st.emplace_back(table.size() * 4);
    for (size_t i = 0; i < table.size(); ++i) {
      const int32_t v = static_cast<int32_t>(table[i]);
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
    bt.dtype = DType::I32, bt.data = bytes.data();
  }
  return Context::from_paged(keys, values, bt, r.len, std::vector<int64_t>(r.B(), -3), ps.nhd ? "NHD" : "HND",
                             std::nullopt, std::vector<float>(r.B(), 4.f), "paged");
}

// The targets that must match bitwise: every available backend that declares paged and strided caches, under each
// of its KV cache formats (a backend reads the same rows in the same order either way, so only the addressing
// differs), and the cpu backend under every attention kernel this CPU runs.
struct BitwiseRun {
  std::string backend, kv, kernels;
};
std::vector<BitwiseRun> bitwise_runs() {
  std::vector<BitwiseRun> runs;
  for (const BackendInfo& b : registered_backends()) {
    if (!b.features.paged_cache || !b.features.strided_cache || !b.unavailable().empty()) continue;
    for (const std::string& kv : b.kv_formats) runs.push_back({b.name, kv, ""});
  }
#ifdef ALPAMAYO_WITH_CPU_BACKEND
  for (bool int8 : {false, true})
    for (cpu::AttnKernel k : cpu::kAttnKernels)
      if (cpu::attn_kernel_unavailable(k, int8).empty())
        runs.push_back({"cpu", int8 ? "int8" : "bf16",
                        std::string(int8 ? "attention_kv_int8=" : "attention=") + cpu::attn_kernel_name(k)});
#endif
  return runs;
}

std::vector<float> sample(const std::shared_ptr<const Model>& m, const Context& c, size_t* bytes = nullptr) {
  Session s(m);
  s.bind(c);
  std::vector<float> a = s.sample({.seed = 11}).action;
  if (bytes) *bytes = s.buffer_bytes();
  return a;
}

void expect_bitwise(Problem& p, const Context& got, const Context& want, const std::string& at,
                    const std::vector<BitwiseRun>& runs = bitwise_runs()) {
  ASSERT_FALSE(runs.empty()) << at << ": no backend declares paged and strided caches";
  for (const BitwiseRun& r : runs) {
    const auto m = p.model(r.backend, "", 2, {}, r.kv, r.kernels);
    const std::vector<float> a = sample(m, got), b = sample(m, want);
    for (float x : b) ASSERT_TRUE(std::isfinite(x)) << at;
    EXPECT_EQ(a, b) << at << " on " << r.backend << " kv " << r.kv << " " << r.kernels;
  }
}

// Samples 0, 2 and 3 share their first two pages (sample 3 has no others); sample 1 has pages of its own.
Rows sharing_rows(int S, uint64_t seed) {
  return Rows::make({0, 1, 0, 0}, {2 * S, 0}, {2 * S + S + 5, 3 * S - (S > 1 ? 2 : 0), 2 * S + 2 * S + 1, 2 * S},
                    seed);
}
// Every sample on pages of its own.
Rows separate_rows(int S, uint64_t seed) { return Rows::make({0, 1, 2}, {0, 0, 0}, {S + 9, 1, 2 * S + 3}, seed); }

class Paged : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(Paged, EqualsTheDenseBindingOfTheSameRows) {
  const auto [S, nhd, combined] = GetParam();
  for (DType dt : {DType::BF16, DType::F32}) {
    Problem p(paged_shape(dt));
    for (bool sharing : {false, true}) {
      Store st;
      const Rows r = sharing ? sharing_rows(S, 7 + S) : separate_rows(S, 9 + S);
      int64_t W = 0;
      const PagedSpec spec{S, nhd, combined, S != 16, 3};
      const Context paged = paged_context(r, dt, spec, st, &W, 5 + S);
      const Context dense = dense_context(r, dt, sharing, W * S, st);
      const KVCache& kv = paged.kv();
      ASSERT_EQ(kv.G, sharing ? 2 : 3);
      ASSERT_EQ(kv.paged(), true);
      if (sharing) {  // the shared pages found and bound as one prompt; each member's other pages its suffix
        EXPECT_EQ(kv.prompt_of, (std::vector<int64_t>{0, 1, 0, 0}));
        EXPECT_EQ(kv.valid_len, (std::vector<int64_t>{2 * S, r.len[1]}));
        EXPECT_EQ(kv.suffix_len, (std::vector<int64_t>{r.len[0] - 2 * S, 0, r.len[2] - 2 * S, 0}));
      } else {
        EXPECT_TRUE(kv.prompt_of.empty());
        EXPECT_TRUE(kv.suffix_key.empty());
      }
      const std::string at = std::string("page size ") + std::to_string(S) + (nhd ? " NHD" : " HND") +
                             (combined ? " combined" : " split") + (sharing ? " shared" : " separate") + " " +
                             dtype_name(dt);
      // Every kernel at one page size; elsewhere each backend's default kernels.
      std::vector<BitwiseRun> runs = bitwise_runs();
      if (S != 16 || dt != DType::BF16)
        runs.erase(std::remove_if(runs.begin(), runs.end(), [](const BitwiseRun& x) { return !x.kernels.empty(); }),
                   runs.end());
      // The emulated cuda backend (a SIMT emulator, most of this suite's time) at one page size: these pools are
      // host memory, which it gathers by kv_row_offset at bind whatever the page size; its kernels' own page-table
      // reads are tested on "device" pools (tests/cuda_emu) and in the op suite.
      if (S != 16)
        runs.erase(std::remove_if(runs.begin(), runs.end(), [](const BitwiseRun& x) { return x.backend == "cuda_emu"; }),
                   runs.end());
      expect_bitwise(p, paged, dense, at, runs);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Paged,
                         ::testing::Combine(::testing::Values(1, 16, 256), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return "page" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_NHD" : "_HND") +
                                  (std::get<2>(info.param) ? "_combined" : "_split");
                         });

// Dense caches in the engines' other layouts, one buffer per layer: token-major [B, P, H, d] (TensorRT-LLM's
// contiguous cache, SGLang's per-request view), K and V interleaved as [B, 2, H, P, d] and [2, B, P, H, d].
TEST(Strided, TokenMajorAndInterleavedViewsEqualTheContiguousBinding) {
  const DType dt = DType::BF16;
  Problem p(paged_shape(dt));
  Store st;
  const Rows r = separate_rows(16, 3);
  const int64_t P = 40, H = r.Hkv, d = r.d, B = r.B();
  const Context dense = dense_context(r, dt, false, P, st);
  enum Kind { TokenMajor, BKV, KVB };
  for (Kind kind : {TokenMajor, BKV, KVB}) {
    KVCache kv = dense.kv();
    kv.key.clear(), kv.value.clear();
    for (int l = 0; l < r.L; ++l) {
      void* buf = alloc(st, size_t(2 * B * H * P * d), dt, NAN);
      // Strides of [b, h, i, c] for K (k = 0) and V, and their offsets in elements.
      std::vector<int64_t> s;
      int64_t off[2];
      if (kind == TokenMajor) s = {P * H * d, d, H * d, 1}, off[0] = 0, off[1] = B * P * H * d;
      if (kind == BKV) s = {2 * H * P * d, P * d, d, 1}, off[0] = 0, off[1] = H * P * d;
      if (kind == KVB) s = {P * H * d, d, H * d, 1}, off[0] = 0, off[1] = B * P * H * d;
      for (int k = 0; k < 2; ++k) {
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < H; ++h)
            for (int64_t i = 0; i < r.len[b]; ++i)
              for (int64_t c = 0; c < d; ++c)
                put(dt, buf, off[k] + b * s[0] + h * s[1] + i * s[2] + c, r.value(l, k, b, h, i)[c]);
        TensorView t{dt, {B, H, P, d}, static_cast<const char*>(buf) + off[k] * 2, (k ? "value." : "key.") + std::to_string(l), s};
        (k ? kv.value : kv.key).push_back(t);
      }
    }
    const Context strided = Context::from_views(kv, std::vector<int64_t>(B, -3), std::nullopt,
                                                std::vector<float>(B, 4.f), "strided");
    EXPECT_EQ(context_features(strided.kv()), std::vector<std::string>{"strided cache views"});
    expect_bitwise(p, strided, dense, "strided kind " + std::to_string(kind));
  }
}

#ifdef ALPAMAYO_WITH_CPU_BACKEND
// A paged bf16 binding is read in place: the session holds exactly the buffers of the dense binding of the same
// sizes (no copy of the cache).
TEST(PagedBind, BindAddsNoCacheCopy) {
  Problem p(paged_shape(DType::BF16));
  Store st;
  const Rows r = sharing_rows(16, 2);
  int64_t W = 0;
  const Context paged = paged_context(r, DType::BF16, {16, true, false, true, 3}, st, &W, 1);
  const Context dense = dense_context(r, DType::BF16, true, W * 16, st);
  const auto m = p.model("cpu", "");
  size_t paged_bytes = 0, dense_bytes = 0;
  sample(m, paged, &paged_bytes);
  sample(m, dense, &dense_bytes);
  EXPECT_EQ(paged_bytes, dense_bytes);
}
#endif

// A backend that does not declare strided or paged caches (the test-only `minimal`, test_backend_features.cpp) is
// refused them at bind, naming the feature and the backends that run it.
TEST(PagedBind, UndeclaredBackendsRefuseThem) {
  Problem p(paged_shape(DType::F32));
  Store st;
  const Rows r = separate_rows(16, 4);
  int64_t W = 0;
  const Context paged = paged_context(r, DType::F32, {16, true, false, true, 3}, st, &W, 2);
  Session s(p.model("minimal", "f32"));
  expect_error([&] { s.bind(paged); }, {"the minimal backend does not run paged caches", "(backends that do:", "reference"});
  EXPECT_FALSE(s.bound());
  // The first rows of a larger dense cache: a view with the larger cache's strides.
  const Context dense = dense_context(r, DType::F32, false, 64, st);
  KVCache kv = dense.kv();
  kv.P = 40;
  for (auto* list : {&kv.key, &kv.value})
    for (TensorView& t : *list) t.strides = {t.shape[1] * 64 * t.shape[3], 64 * t.shape[3], t.shape[3], 1}, t.shape[2] = 40;
  const Context strided = Context::from_views(kv, dense.rope_delta(), std::nullopt, dense.v0(), "strided");
  expect_error([&] { s.bind(strided); }, {"the minimal backend does not run strided cache views"});
  EXPECT_EQ(sample(p.model("reference", ""), strided), sample(p.model("reference", ""), dense));
}

// Classifier-free guidance over two paged contexts (the guided one sharing pages, the unguided one not): bitwise the
// dense pair, on every backend that declares the features.
TEST(PagedBind, GuidanceOverPagedContexts) {
  Problem p(paged_shape(DType::BF16));
  Store st;
  const Rows guided = sharing_rows(16, 21), unguided = Rows::make({0, 1, 2, 3}, {0, 0, 0, 0}, {30, 7, 41, 16}, 22);
  int64_t Wg = 0, Wu = 0;
  const Context pg = paged_context(guided, DType::BF16, {16, false, true, true, 2}, st, &Wg, 3);
  const Context pu = paged_context(unguided, DType::BF16, {16, true, false, false, 1}, st, &Wu, 4);
  const Context dg = dense_context(guided, DType::BF16, true, Wg * 16, st);
  const Context du = dense_context(unguided, DType::BF16, false, Wu * 16, st);
  int ran = 0;
  for (const BitwiseRun& r : bitwise_runs()) {
    if (!r.kernels.empty() || !find_backend(r.backend).features.guidance) continue;
    const auto m = p.model(r.backend, "", 2, {}, r.kv);
    auto guided_sample = [&](const Context& g, const Context& u) {
      Session s(m);
      s.bind(g, {.guidance = Guidance{u, 2.5}});
      return s.sample({.seed = 4}).action;
    };
    EXPECT_EQ(guided_sample(pg, pu), guided_sample(dg, du)) << r.backend << " kv " << r.kv;
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

// Every bad input names the tensor and the page.
TEST(PagedBind, ValidationNamesTheTensorAndThePage) {
  Store st;
  const int64_t N = 4, S = 4, H = 2, d = 8;
  void* pool = alloc(st, size_t(N * S * H * d), DType::BF16, 0.5f);
  const TensorView k{DType::BF16, {N, S, H, d}, pool, "k0"}, v{DType::BF16, {N, S, H, d}, pool, "v0"};
  std::vector<int64_t> tbl = {0, 3, 1, 2};
  const TensorView bt{DType::I64, {2, 2}, tbl.data(), "bt"};
  const std::vector<int64_t> rd = {0, 0};
  EXPECT_NO_THROW(Context::from_paged({k}, {v}, bt, {8, 5}, rd));
  std::vector<int64_t> out = {0, 4, 1, 2};
  expect_error([&] { Context::from_paged({k}, {v}, {DType::I64, {2, 2}, out.data(), "bt"}, {8, 5}, rd); },
               {"block_table[0, 1] = 4", "outside the pool k0 of 4 pages"});
  expect_error([&] { Context::from_paged({k}, {v}, bt, {9, 5}, rd); },
               {"valid_len[0] = 9", "2 pages of 4 rows"});
  const TensorView v3{DType::BF16, {N, S, 1, d}, pool, "v_heads"};
  expect_error([&] { Context::from_paged({k}, {v3}, bt, {8, 5}, rd); }, {"v_heads", "1 KV heads", "k0 has 2"});
  std::vector<float> ftbl(4, 0.f);
  expect_error([&] { Context::from_paged({k}, {v}, {DType::F32, {2, 2}, ftbl.data(), "bt"}, {8, 5}, rd); },
               {"block_table must be int32 or int64, found F32"});
  expect_error([&] { Context::from_paged({k}, {v}, bt, {8, 5}, rd, "NDH"); }, {"layout must be"});
  const TensorView k3{DType::BF16, {N, 3, H, d}, pool, "k_odd"};
  expect_error([&] { Context::from_paged({k3}, {k3}, bt, {8, 5}, rd); }, {"k_odd", "page size 3"});
  // A NaN in a row some sample reads names the page.
  std::vector<uint16_t> nan_pool(size_t(N * S * H * d), f32_to_bf16(0.5f));
  nan_pool[size_t(((3 * S + 1) * H + 1) * d + 2)] = f32_to_bf16(NAN);  // page 3, row 1, head 1
  const TensorView kn{DType::BF16, {N, S, H, d}, nan_pool.data(), "k_nan"};
  try {
    Context::from_paged({kn}, {v}, bt, {8, 5}, rd);
    ADD_FAILURE() << "a NaN in an attended row must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NonFinite);
    EXPECT_NE(std::string(e.what()).find("page 3"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Context::from_paged({kn}, {v}, bt, {5, 5}, rd));  // row 5 of sample 0 (page 3, row 1) unread
}

}  // namespace
}  // namespace alpamayo
