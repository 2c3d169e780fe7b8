// The cuda backend beyond the conformance suite (which compares it with the reference): caches bound from GPU
// memory without a copy (shared prompts, padding, guidance and paged pools included), the device-side NaN/Inf scan
// of such caches, graph replays against eager launches, per-step timings and recapture when the step count
// changes. Every test that needs a GPU reports itself skipped, with the reason, on a machine without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "alpamayo/engine.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::TempDir;

#define SKIP_WITHOUT_GPU() \
  if (const std::string why = find_backend("cuda").unavailable(); !why.empty()) GTEST_SKIP() << "cuda: " << why

void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// BackendOptions with only the weight format set (a designated initializer of just .weights makes GCC 12 warn
// about the members left out).
BackendOptions weights_opt(const char* format) {
  BackendOptions o;
  o.weights = format;
  return o;
}

// A checkpoint and a context file of the tiny test size (B = 3, ragged valid lengths).
struct Fixture {
  TempDir tmp;
  std::shared_ptr<const Checkpoint> ck;
  explicit Fixture(DType cache = DType::BF16) {
    auto spec = test::tiny_spec();
    spec.d = 32;
    write_synthetic_checkpoint(tmp / "ck", spec);
    ck = Checkpoint::open(tmp / "ck");
    SyntheticContextSpec cs;
    cs.B = 3;
    cs.P = 40;
    cs.valid_len = {40, 17, 0};
    cs.rope_delta = {-7, 2, 0};
    cs.dtype = cache;
    write_synthetic_context(tmp / "ctx", ck->config(), cs);
  }
  Context host() const { return Context::open(tmp / "ctx"); }
};

// The context's cache tensors copied into GPU memory, and a context over those device views.
struct DeviceContext {
  std::vector<void*> buffers;
  Context file;
  KVCache kv;
  explicit DeviceContext(Context f) : file(std::move(f)), kv(file.kv()) {
    for (auto* list : {&kv.key, &kv.value})
      for (TensorView& t : *list) {
        void* p = nullptr;
        cuda_ok(cudaMalloc(&p, t.nbytes()));
        cuda_ok(cudaMemcpy(p, t.data, t.nbytes(), cudaMemcpyHostToDevice));
        buffers.push_back(p);
        t.data = p;
        t.device = {DeviceType::CUDA, 0};
      }
  }
  ~DeviceContext() {
    for (void* p : buffers) cudaFree(p);
  }
  Context context() const {
    return Context::from_views(kv, file.rope_delta(), file.history(), file.v0(), "device ctx");
  }
};

TEST(CudaBackend, RegisteredWithItsFormatsAndProbe) {
  const BackendInfo& b = find_backend("cuda");
  EXPECT_EQ(b.weight_formats, (std::vector<std::string>{"bf16", "fp8"}));
  const std::string why = b.unavailable();
  if (!why.empty()) {
    // The default backend must be one that runs here.
    EXPECT_NE(backend_names().front(), "cuda");
    Fixture f;
    test::expect_error([&] { Model::load(f.ck, "cuda"); }, {"backend cuda cannot run here", why});
  }
}

TEST(CudaBackend, DeviceCacheIsBoundInPlaceAndMatchesTheHostCache) {
  SKIP_WITHOUT_GPU();
  for (DType cache : {DType::BF16, DType::F32})
    for (const char* format : {"bf16", "fp8"}) {
      Fixture f(cache);
      auto m = Model::load(f.ck, "cuda", weights_opt(format));
      Session on_host(m), on_gpu(m);
      on_host.bind(f.host());
      DeviceContext dc(f.host());
      on_gpu.bind(dc.context());
      const SampleResult a = on_host.sample({.seed = 3, .all_steps = true});
      const SampleResult b = on_gpu.sample({.seed = 3, .all_steps = true});
      EXPECT_EQ(a.action, b.action) << format << " " << dtype_name(cache);
      EXPECT_EQ(a.v_steps, b.v_steps) << format << " " << dtype_name(cache);
      if (cache == DType::BF16) {
        // The host cache was uploaded into the session's own buffers; the device cache was not copied.
        const size_t cache_bytes = 2 * size_t(f.ck->config().L) * dc.kv.key[0].nbytes();
        EXPECT_GE(on_host.buffer_bytes(), on_gpu.buffer_bytes() + cache_bytes) << format;
      }
    }
}

TEST(CudaBackend, NonFiniteDeviceCacheRowsAreNamed) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  auto m = Model::load(f.ck, "cuda");
  DeviceContext dc(f.host());
  const ExpertConfig& c = f.ck->config();
  const int P = dc.kv.P, d = dc.kv.d, H = dc.kv.Hkv;
  auto poke = [&](int layer, int b, int h, int row, int col, uint16_t bits) {
    uint16_t* p = static_cast<uint16_t*>(const_cast<void*>(dc.kv.value[layer].data));
    cuda_ok(cudaMemcpy(p + ((size_t(b) * H + h) * P + row) * d + col, &bits, 2, cudaMemcpyHostToDevice));
  };
  Session s(m);
  poke(1, 1, 1, 20, 3, 0x7fc0);  // NaN in a padding row of sample 1 (S = 17): never read, no error
  poke(1, 2, 0, 0, 0, 0x7f80);   // +Inf in sample 2, which has no valid rows
  s.bind(dc.context());
  poke(c.L - 1, 1, 0, 16, 5, 0x7fc0);  // NaN in the last valid row of sample 1
  test::expect_error([&] { s.bind(dc.context()); }, {dc.kv.value[c.L - 1].name, "non-finite", "[1, 0, 16, 5]"});
  EXPECT_FALSE(s.bound());
}

// The fixture's cache as paged pools in GPU memory: per layer and K / V a token-major pool [N, 8, Hkv, d] of the
// cache's dtype, each sample's pages in reverse order after one unused page of NaN, and a context over them.
struct DevicePagedContext {
  static constexpr int64_t kPage = 8;
  std::vector<void*> buffers;
  std::vector<TensorView> keys, values;
  std::vector<int64_t> table;
  int64_t W = 1;
  Context file;
  explicit DevicePagedContext(Context f) : file(std::move(f)) {
    const KVCache& kv = file.kv();
    const int64_t B = kv.B, H = kv.Hkv, d = kv.d;
    std::vector<int64_t> first(B), pages(B);
    int64_t N = 1;
    for (int b = 0; b < B; ++b) pages[b] = (kv.valid_len[b] + kPage - 1) / kPage, first[b] = N, N += pages[b];
    for (int64_t n : pages) W = std::max(W, n);
    table.assign(size_t(B * W), -1);
    for (int b = 0; b < B; ++b)
      for (int64_t i = 0; i < pages[b]; ++i) table[size_t(b * W + i)] = first[b] + pages[b] - 1 - i;
    for (int k = 0; k < 2; ++k)
      for (size_t l = 0; l < kv.key.size(); ++l) {
        const TensorView& t = (k ? kv.value : kv.key)[l];
        const size_t es = dtype_size(t.dtype);
        std::vector<uint8_t> pool(size_t(N * kPage * H * d) * es, 0xff);  // all ones: NaN in every dtype
        for (int b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < kv.valid_len[b]; ++i)
              std::memcpy(&pool[size_t(((table[size_t(b * W + i / kPage)] * kPage + i % kPage) * H + h) * d) * es],
                          kv_row_view(kv, t, false, b, int(h), i).data, size_t(d) * es);
        void* p = nullptr;
        cuda_ok(cudaMalloc(&p, pool.size()));
        cuda_ok(cudaMemcpy(p, pool.data(), pool.size(), cudaMemcpyHostToDevice));
        buffers.push_back(p);
        TensorView v{t.dtype, {N, kPage, H, d}, p, (k ? "v_pages." : "k_pages.") + std::to_string(l)};
        v.device = {DeviceType::CUDA, 0};
        (k ? values : keys).push_back(v);
      }
  }
  ~DevicePagedContext() {
    for (void* p : buffers) cudaFree(p);
  }
  Context context() const {
    const TensorView bt{DType::I64, {file.kv().B, W}, table.data(), "block_table"};
    return Context::from_paged(keys, values, bt, file.kv().valid_len, file.rope_delta(), "NHD", file.history(),
                               file.v0(), "paged device ctx");
  }
};

// Paged pools in GPU memory are read through their page table: bitwise the host-bound dense cache, graph replays
// and eager launches alike; a bf16 pool is not copied.
TEST(CudaBackend, PagedDeviceCacheIsReadInPlace) {
  SKIP_WITHOUT_GPU();
  for (DType cache : {DType::BF16, DType::F32}) {
    Fixture f(cache);
    DevicePagedContext dc(f.host());
    for (bool graphs : {true, false}) {
      BackendOptions o = weights_opt("bf16");
      o.graphs = graphs;
      auto m = Model::load(f.ck, "cuda", o);
      Session on_host(m), on_gpu(m);
      on_host.bind(f.host());
      on_gpu.bind(dc.context());
      const SampleResult a = on_host.sample({.seed = 3, .all_steps = true});
      const SampleResult b = on_gpu.sample({.seed = 3, .all_steps = true});
      EXPECT_EQ(a.action, b.action) << dtype_name(cache) << " graphs " << graphs;
      EXPECT_EQ(a.v_steps, b.v_steps) << dtype_name(cache) << " graphs " << graphs;
      if (cache == DType::BF16) EXPECT_LT(on_gpu.buffer_bytes(), on_host.buffer_bytes());
    }
  }
}

// Five samples sharing the fixture's prompts (the cascade), left padding, and classifier-free guidance over another
// sharing of the same prompts: the cache bound from GPU memory in place gives bitwise the host-bound result, graph
// replays give bitwise the eager launches, and a NaN in a left-padding row of the GPU copy is never read.
TEST(CudaBackend, SharedPromptsAndGuidanceOnDeviceCaches) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const Context host = f.host();
  DeviceContext dc(f.host());
  auto shared = [](KVCache kv, std::vector<int64_t> prompts, std::vector<int64_t> pad) {
    kv.B = static_cast<int>(prompts.size());
    kv.prompt_of = std::move(prompts);
    kv.prefix_pad = std::move(pad);
    return kv;
  };
  auto ctx = [](const KVCache& kv, const char* name) {
    return Context::from_views(kv, std::vector<int64_t>(kv.B, -3), std::nullopt, std::vector<float>(kv.B, 3.f), name);
  };
  const std::vector<int64_t> guided = {0, 0, 1, 0, 1}, unguided = {1, 1, 0, 1, 0};
  const std::vector<int64_t> pad_g = {2, 0, 0}, pad_u = {2, 3, 0};  // prompt 0's rows 0-1 are padding in both
  const uint16_t nan = 0x7fc0;
  const int H = dc.kv.Hkv, P = dc.kv.P, d = dc.kv.d;
  for (size_t l = 0; l < dc.kv.value.size(); ++l)
    for (int h = 0; h < H; ++h)
      cuda_ok(cudaMemcpy(static_cast<uint16_t*>(const_cast<void*>(dc.kv.value[l].data)) + (size_t(h) * P + 1) * d,
                         &nan, 2, cudaMemcpyHostToDevice));
  for (const char* format : {"bf16", "fp8"}) {
    BackendOptions eager_opts = weights_opt(format);
    eager_opts.graphs = false;
    auto graph_model = Model::load(f.ck, "cuda", weights_opt(format));
    auto eager_model = Model::load(f.ck, "cuda", eager_opts);
    auto run = [&](const std::shared_ptr<const Model>& m, const KVCache& kv) {
      Session s(m);
      s.bind(ctx(shared(kv, guided, pad_g), "guided"),
             {.guidance = Guidance{ctx(shared(kv, unguided, pad_u), "unguided"), 1.5}});
      s.sample({.seed = 2, .all_steps = true});  // captures; the next one replays
      return s.sample({.seed = 4, .all_steps = true});
    };
    const SampleResult on_host = run(graph_model, host.kv()), on_gpu = run(graph_model, dc.kv);
    const SampleResult eager = run(eager_model, dc.kv);
    EXPECT_EQ(on_host.action, on_gpu.action) << format;
    EXPECT_EQ(on_host.v_steps, on_gpu.v_steps) << format;
    EXPECT_EQ(eager.action, on_gpu.action) << format;
    EXPECT_EQ(eager.v_steps, on_gpu.v_steps) << format;
    for (float v : on_gpu.v_steps) ASSERT_TRUE(std::isfinite(v)) << format;
  }
}

TEST(CudaBackend, GraphReplayEqualsEagerLaunches) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  for (const char* format : {"bf16", "fp8"}) {
    BackendOptions eager_opts = weights_opt(format);
    eager_opts.graphs = false;
    auto eager_model = Model::load(f.ck, "cuda", eager_opts);
    auto graph_model = Model::load(f.ck, "cuda", weights_opt(format));
    Session eager(eager_model), graph(graph_model);
    eager.bind(f.host(), {.capture = {.step = 1, .layers = true}});
    graph.bind(f.host(), {.capture = {.step = 1, .layers = true}});
    for (int rep = 0; rep < 2; ++rep) {  // the second graph run is a replay
      const SampleResult a = eager.sample({.seed = 9, .all_steps = true});
      const SampleResult b = graph.sample({.seed = 9, .all_steps = true});
      EXPECT_EQ(a.action, b.action) << format;
      EXPECT_EQ(a.v_steps, b.v_steps) << format;
      EXPECT_EQ(a.x_steps, b.x_steps) << format;
      EXPECT_EQ(eager.captures().layers, graph.captures().layers) << format;
      EXPECT_EQ(eager.captures().hidden, graph.captures().hidden) << format;
      EXPECT_EQ(graph.captures().step, 1);
    }
  }
}

TEST(CudaBackend, StepTimesAndRecaptureForOtherStepCounts) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  auto m = Model::load(f.ck, "cuda");
  Session s(m), fresh(m);
  s.bind(f.host());
  const SampleResult three = s.sample({.steps = 3, .seed = 1});
  ASSERT_EQ(three.step_seconds.size(), 3u);
  for (double t : three.step_seconds) EXPECT_GT(t, 0.0);
  const SampleResult five = s.sample({.steps = 5, .seed = 1});
  EXPECT_EQ(s.sample({.steps = 3, .seed = 1}).action, three.action);
  fresh.bind(f.host());
  EXPECT_EQ(fresh.sample({.steps = 5, .seed = 1}).action, five.action);
  // Long samples run without a graph (eagerly launched), with the same results as a graph would give.
  const SampleResult longer = s.sample({.steps = 70, .seed = 1});
  EXPECT_EQ(longer.steps, 70);
}

}  // namespace
}  // namespace alpamayo
