// The cuda_emu backend (the cuda backend's sources compiled for the host over the fake runtime of fake_cuda.h,
// the kernels running in the SIMT emulator; registered by cuda_emu_backend.cpp) beyond what the conformance suite
// runs on every registered backend: the weight matmuls other than the defaults, graph replay against eager
// launches, a cache in "device" memory bound in place and scanned, the backend's options, and (disabled by
// default) the full-width kernel geometry. This checks the backend's orchestration (buffers, layouts between
// kernels, split-K outputs, fp8 scales, captures, the Euler loop) before a GPU ever runs it; the GPU itself is
// checked by the conformance suite on `cuda`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "alpamayo/engine.h"
#include "conformance_util.h"
#include "fake_cublaslt.h"
#include "fake_cuda.h"
#include "model/sampler.h"
#include "test_util.h"

namespace alpamayo {
namespace {

using namespace conformance;

BackendOptions emu_options(const std::string& format, const std::string& kernels = "") {
  BackendOptions o;
  o.weights = format;
  o.kernels = kernels;
  return o;
}

// The emulated backend with weight matmul `gemm` against the exact reference, as the conformance suite compares
// a target (expect_run_close).
void compare_with_reference(const Shape& sh, const std::string& format, const std::string& gemm) {
  const std::string at = "cuda_emu/" + format + " (" + gemm + ") " + sh.name;
  Problem p(sh);
  const auto oracle = p.model("reference", "f32");
  const RunOut ref = run(oracle, p.context(), 0);
  const auto m = p.model("cuda_emu", emu_options(format, "gemm=" + gemm));
  EXPECT_EQ(m->kernels(), "gemm=" + gemm) << at;
  const RunOut got = run(m, p.context(), 0);
  // cuBLASLt's fp8 path quantizes the activations too (W8A8): e4m3 matmul inputs.
  const bool w8a8 = format == "fp8" && gemm == "cublaslt";
  const ErrorModel em = error_model_for(p, w8a8 ? "fp8" : "bf16", format, "f32");
  expect_run_close(got, ref, *oracle, p.context(), em, sh, at);
}

// The defaults (bf16 through cuBLASLt, fp8 through our W8A16 kernel) run in the conformance suite; the other two.
TEST(CudaEmulated, OtherMatmulsMatchTheReference) {
  compare_with_reference(shapes()[1], "bf16", "own");
  compare_with_reference(shapes()[1], "fp8", "cublaslt");
  compare_with_reference(shapes()[3], "bf16", "own");  // d = 48, T = 5, a sample without cache rows
}

TEST(CudaEmulated, KernelsOptionPicksTheMatmul) {
  Problem p(shapes()[0]);
  EXPECT_EQ(p.model("cuda_emu", emu_options("bf16"))->kernels(), "gemm=cublaslt");
  EXPECT_EQ(p.model("cuda_emu", emu_options("fp8"))->kernels(), "gemm=own");
  EXPECT_EQ(p.model("cuda_emu", emu_options("fp8", "gemm=cublaslt"))->kernels(), "gemm=cublaslt");
  test::expect_error([&] { p.model("cuda_emu", emu_options("bf16", "gemm=fast")); },
                     {"gemm=fast", "expected gemm=cublaslt or gemm=own"});
  test::expect_error([&] { p.model("cuda_emu", emu_options("bf16", "attention=own")); }, {"attention=own"});
  // A value from the environment (options_from_environment: the entry's kernels_variable) is named as such.
  BackendOptions from_env = emu_options("bf16", "gemm=fast");
  from_env.kernels_source = find_backend("cuda_emu").kernels_variable;
  EXPECT_EQ(from_env.kernels_source, "ALPAMAYO_CUDA_GEMM");
  test::expect_error([&] { p.model("cuda_emu", from_env); }, {"gemm=fast", "(from ALPAMAYO_CUDA_GEMM)"});
}

TEST(CudaEmulated, CublasLtPathOptionReachesTheLoader) {
  Problem p(shapes()[0]);
  BackendOptions o = emu_options("bf16");
  o.cublaslt_path = "/opt/toolkit/lib64/libcublasLt.so.13";
  p.model("cuda_emu", o);
  ASSERT_FALSE(cuda_emu::fake_cublaslt_requests().empty());
  EXPECT_EQ(cuda_emu::fake_cublaslt_requests().back(), o.cublaslt_path);
  p.model("cuda_emu", emu_options("bf16"));
  EXPECT_EQ(cuda_emu::fake_cublaslt_requests().back(), "");
}

// The cache from "device" memory of the fake runtime: bound in place (no upload), bitwise the host-bound
// result; NaN in one of its valid rows is found by the device-side scan.
TEST(CudaEmulated, DeviceCacheInPlaceAndScanned) {
  const Shape& sh = shapes()[1];
  Problem p(sh);
  const auto m = p.model("cuda_emu", emu_options("bf16"));
  Context host = p.context();
  KVCache kv = host.kv();
  std::vector<void*> bufs;
  for (auto* list : {&kv.key, &kv.value})
    for (TensorView& t : *list) {
      void* d = nullptr;
      ASSERT_EQ(fake_cuda::Malloc(&d, t.nbytes()), cudaSuccess);
      std::memcpy(d, t.data, t.nbytes());
      bufs.push_back(d);
      t.data = d;
      t.device = {DeviceType::CUDA, 0};
    }
  auto views = [&](const KVCache& c, const std::string& name) {
    return Context::from_views(c, host.rope_delta(), std::nullopt, std::vector<float>(c.B, 3.f), name);
  };
  const Context dev = views(kv, "dev");
  Session a(m), b(m);
  a.bind(host, {.capture = {.step = 1, .layers = true}});
  b.bind(dev, {.capture = {.step = 1, .layers = true}});
  EXPECT_EQ(a.sample({.steps = 2, .seed = 11}).action, b.sample({.steps = 2, .seed = 11}).action);
  EXPECT_EQ(a.captures().layers, b.captures().layers);
  EXPECT_GT(a.buffer_bytes(), b.buffer_bytes());  // the host cache was uploaded, the device cache not

  uint16_t* v1 = static_cast<uint16_t*>(const_cast<void*>(kv.value[1].data));
  v1[((size_t(2) * sh.Hkv + 1) * sh.ctx.P + 39) * sh.d + 7] = 0x7f80;  // +Inf in sample 2's last valid row
  Session bad(m);
  test::expect_error([&] { bad.bind(views(kv, "dev")); }, {kv.value[1].name, "non-finite", "[2, 1, 39, 7]"});
  // A view that claims device memory but points at host memory.
  KVCache lie = host.kv();
  lie.key[0].device = {DeviceType::CUDA, 0};
  Session lying(m);
  test::expect_error([&] { lying.bind(views(lie, "lie")); }, {lie.key[0].name, "cuda:0", "host memory"});
  for (void* d : bufs) fake_cuda::Free(d);
}

// A paged cache in "device" memory (token-major pages of 8 rows, one pool per layer and K / V, pages in reverse
// order, an unused NaN page): read in place through the page table (less memory than the host-bound run), bitwise
// the host-bound dense cache; a non-finite value in a page some sample reads is found by the scan and named by its
// sequence, head, row and column. Then token-major dense views in "device" memory, in place and bitwise the same.
TEST(CudaEmulated, PagedDeviceCacheInPlaceAndScanned) {
  const Shape& sh = shapes()[1];  // bf16 cache, no padding, a sample without cache rows
  Problem p(sh);
  const auto m = p.model("cuda_emu", emu_options("bf16"));
  const Context host = p.context();
  const KVCache& kv = host.kv();
  const int64_t S = 8, H = sh.Hkv, d = sh.d, B = kv.B;
  std::vector<int64_t> first(B), pages(B);
  int64_t N = 1;  // page 0 unused
  for (int b = 0; b < B; ++b) pages[b] = (kv.valid_len[b] + S - 1) / S, first[b] = N, N += pages[b];
  const int64_t W = std::max<int64_t>(1, *std::max_element(pages.begin(), pages.end()));
  std::vector<int64_t> table(size_t(B * W), -1);
  for (int b = 0; b < B; ++b)
    for (int64_t i = 0; i < pages[b]; ++i) table[size_t(b * W + i)] = first[b] + pages[b] - 1 - i;
  std::vector<void*> bufs;
  std::vector<TensorView> kp, vp;
  for (int k = 0; k < 2; ++k)
    for (int l = 0; l < sh.L; ++l) {
      const TensorView& t = (k ? kv.value : kv.key)[l];
      std::vector<uint16_t> pool(size_t(N * S * H * d), 0x7fc0);  // NaN
      for (int b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < kv.valid_len[b]; ++i)
            std::memcpy(&pool[size_t(((table[size_t(b * W + i / S)] * S + i % S) * H + h) * d)],
                        kv_row_view(kv, t, false, b, int(h), i).data, size_t(d) * 2);
      void* dev = nullptr;
      ASSERT_EQ(fake_cuda::Malloc(&dev, pool.size() * 2), cudaSuccess);
      std::memcpy(dev, pool.data(), pool.size() * 2);
      bufs.push_back(dev);
      (k ? vp : kp).push_back({DType::BF16, {N, S, H, d}, dev, (k ? "v_pages." : "k_pages.") + std::to_string(l)});
      (k ? vp : kp).back().device = {DeviceType::CUDA, 0};
    }
  const TensorView bt{DType::I64, {B, W}, table.data(), "block_table"};
  const std::vector<float> v0(B, 3.f);
  const Context paged = Context::from_paged(kp, vp, bt, kv.valid_len, host.rope_delta(), "NHD", std::nullopt, v0);
  const Context dense = Context::from_views(kv, host.rope_delta(), std::nullopt, v0, "dense");
  Session a(m), b(m);
  a.bind(dense);
  b.bind(paged);
  EXPECT_EQ(a.sample({.steps = 2, .seed = 5}).action, b.sample({.steps = 2, .seed = 5}).action);
  EXPECT_LT(b.buffer_bytes(), a.buffer_bytes());  // the host cache was uploaded, the paged pool not

  // +Inf in sample 2's row 20 (its page 2, the pool's first page of sample 2's), head 1, column 5.
  uint16_t* v1 = static_cast<uint16_t*>(const_cast<void*>(vp[1].data));
  v1[size_t(((table[size_t(2 * W + 2)] * S + 4) * H + 1) * d + 5)] = 0x7f80;
  Session bad(m);
  test::expect_error(
      [&] { bad.bind(Context::from_paged(kp, vp, bt, kv.valid_len, host.rope_delta(), "NHD", std::nullopt, v0)); },
      {"v_pages.1", "non-finite", "[2, 1, 20, 5]"});

  // Token-major dense views [B, P, H, d] (strides P H d, d, H d, 1) in "device" memory: read in place as well.
  KVCache tm = kv;
  const int64_t P = kv.P;
  for (auto* list : {&tm.key, &tm.value})
    for (TensorView& t : *list) {
      std::vector<uint16_t> buf(size_t(B * P * H * d), 0x7fc0);
      for (int bb = 0; bb < B; ++bb)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < kv.valid_len[bb]; ++i)
            std::memcpy(&buf[size_t(((bb * P + i) * H + h) * d)], kv_row_view(kv, t, false, bb, int(h), i).data,
                        size_t(d) * 2);
      void* dev = nullptr;
      ASSERT_EQ(fake_cuda::Malloc(&dev, buf.size() * 2), cudaSuccess);
      std::memcpy(dev, buf.data(), buf.size() * 2);
      bufs.push_back(dev);
      t.data = dev;
      t.strides = {P * H * d, d, H * d, 1};
      t.device = {DeviceType::CUDA, 0};
    }
  Session c(m);
  c.bind(Context::from_views(tm, host.rope_delta(), std::nullopt, v0, "token-major"));
  EXPECT_EQ(c.sample({.steps = 2, .seed = 5}).action, a.sample({.steps = 2, .seed = 5}).action);
  EXPECT_LT(c.buffer_bytes(), a.buffer_bytes());
  for (void* dv : bufs) fake_cuda::Free(dv);
}

TEST(CudaEmulated, GraphReplayEqualsEagerLaunches) {
  Problem p(shapes()[1]);
  BackendOptions eager_opts = emu_options("fp8");
  eager_opts.graphs = false;
  const RunOut eager = run(p.model("cuda_emu", eager_opts), p.context(), 1);
  const RunOut graph = run(p.model("cuda_emu", emu_options("fp8")), p.context(), 1);
  EXPECT_EQ(eager.r.action, graph.r.action);
  EXPECT_EQ(eager.r.v_steps, graph.r.v_steps);
  EXPECT_EQ(eager.cap.layers, graph.cap.layers);
}

// Twenty samples reading one left-padded prompt, each with suffix rows of its own (0 to 6): the prompt's items
// take 20 * R = 320 query rows (three 128-row tiles, each holding rows of several samples), every sample's own
// item its suffix and own rows; both formats against the exact reference.
TEST(CudaEmulated, TwentySamplesShareOnePrompt) {
  CtxSpec c{40, {40}, std::vector<int64_t>(20, -12), std::vector<int64_t>(20, 0), {3}, 6, {}};
  for (int b = 0; b < 20; ++b) c.suffix.push_back(b % 7);
  const Shape sh{"shared_G1_B20", 2, 64, 4, 2, 32, 128, 8, c, DType::BF16, DType::BF16, 2};
  compare_with_reference(sh, "bf16", "cublaslt");
  compare_with_reference(sh, "fp8", "own");
}

// Shared prompts, left padding and suffixes in "device" memory are bound in place and give bitwise the host-bound
// result; only the rows some sample reads are scanned (the padding rows hold NaN), and a non-finite value in a
// suffix row that is read is named.
TEST(CudaEmulated, SharedPromptDeviceCacheInPlaceAndScanned) {
  const Shape& sh = shapes()[5];
  Problem p(sh);
  const auto m = p.model("cuda_emu", emu_options("bf16"));
  Context host = p.context();
  KVCache kv = host.kv();
  std::vector<void*> bufs;
  for (auto* list : {&kv.key, &kv.value, &kv.suffix_key, &kv.suffix_value})
    for (TensorView& t : *list) {
      void* d = nullptr;
      ASSERT_EQ(fake_cuda::Malloc(&d, t.nbytes()), cudaSuccess);
      std::memcpy(d, t.data, t.nbytes());
      bufs.push_back(d);
      t.data = d;
      t.device = {DeviceType::CUDA, 0};
    }
  auto views = [&](const KVCache& c) {
    return Context::from_views(c, host.rope_delta(), std::nullopt, *host.v0(), "dev");
  };
  Session a(m), b(m);
  a.bind(host);
  b.bind(views(kv));
  EXPECT_EQ(a.sample({.steps = 2, .seed = 11}).action, b.sample({.steps = 2, .seed = 11}).action);
  EXPECT_GT(a.buffer_bytes(), b.buffer_bytes());  // the host cache was uploaded, the device cache not

  uint16_t* s1 = static_cast<uint16_t*>(const_cast<void*>(kv.suffix_value[1].data));
  s1[((size_t(2) * sh.Hkv + 1) * sh.ctx.Q + 6) * sh.d + 3] = 0x7f80;  // +Inf in sample 2's last suffix row
  Session bad(m);
  test::expect_error([&] { bad.bind(views(kv)); }, {kv.suffix_value[1].name, "non-finite", "[2, 1, 6, 3]"});
  for (void* d : bufs) fake_cuda::Free(d);
}

// The whole guided sample over shared prompts is one graph per bind: captured once, replayed by every later
// sample, with no kernel launched outside it; without graphs the same launches run eagerly.
TEST(CudaEmulated, GuidedSharedPromptSampleIsOneGraph) {
  const Shape& sh = shapes()[5];
  Problem p(sh);
  CtxSpec u = sh.ctx;
  u.S = {20, 22};
  u.rope_delta = {-3, -3, 1, -3};
  for (bool graphs : {true, false}) {
    BackendOptions o = emu_options("bf16");
    o.graphs = graphs;
    Session s(p.model("cuda_emu", o));
    s.bind(p.context(), {.guidance = Guidance{p.context(u), 1.5}});
    fake_cuda::Counters& c = fake_cuda::counters();
    const long captures = c.captures, launches = c.graph_launches, eager = c.eager_kernels;
    const SampleResult r1 = s.sample({.steps = 2, .seed = 4});
    const SampleResult r2 = s.sample({.steps = 2, .seed = 4});
    EXPECT_EQ(r1.action, r2.action);
    EXPECT_EQ(c.captures - captures, graphs ? 1 : 0) << graphs;
    EXPECT_EQ(c.graph_launches - launches, graphs ? 2 : 0) << graphs;
    if (graphs)
      EXPECT_EQ(c.eager_kernels - eager, 0);
    else
      EXPECT_GT(c.eager_kernels - eager, 2 * 2 * 2 * sh.L) << "both passes' layers, both steps, both samples";
  }
}

// fp8 weights need an sm_89+ GPU: on an older one (Orin, sm_87) loading them fails naming the GPU and the format,
// the registry's entry says so for `backends`, and bf16 weights still load and run.
TEST(CudaEmulated, Fp8RefusedBelowSm89) {
  const fake_cuda::Device saved = fake_cuda::device();
  const BackendInfo& info = find_backend("cuda_emu");
  Problem p(shapes()[0]);
  fake_cuda::device() = {8, 7, "NVIDIA Orin (fake)"};
  const std::string why = info.format_unavailable("fp8");
  test::expect_error([&] { p.model("cuda_emu", emu_options("fp8")); },
                     {"fp8 weights (e4m3)", "sm_89", "NVIDIA Orin (fake)", "compute capability 8.7"});
  EXPECT_NE(why.find("NVIDIA Orin (fake)"), std::string::npos) << why;
  EXPECT_EQ(info.format_unavailable("bf16"), "");
  EXPECT_NO_THROW(run(p.model("cuda_emu", emu_options("bf16")), p.context(), 0));
  fake_cuda::device() = {8, 9, "NVIDIA L4 (fake)"};
  EXPECT_EQ(info.format_unavailable("fp8"), "");
  EXPECT_NO_THROW(p.model("cuda_emu", emu_options("fp8")));
  fake_cuda::device() = saved;
}

// The seed's layer sizes (D 1536, 16/8 heads, d 128, I 6144) and a 4,700-row cache, two layers, one step:
// the real kernel geometry (128 query rows per KV head, many key ranges, long split-K). Minutes in the
// emulator, so not in the default run: --gtest_also_run_disabled_tests --gtest_filter='*FullWidth*'.
TEST(CudaEmulated, DISABLED_FullWidthTwoLayers) {
  test::TempDir tmp;
  SyntheticCheckpointSpec spec;
  spec.L = 2;
  write_synthetic_checkpoint(tmp / "ck", spec);
  auto ck = Checkpoint::open(tmp / "ck");
  SyntheticContextSpec cs;
  cs.P = 4736;
  cs.valid_len = {4700};
  cs.rope_delta = {-1500};
  write_synthetic_context(tmp / "ctx", ck->config(), cs);
  const Context ctx = Context::open(tmp / "ctx");
  Session ref(Model::load(ck, "reference"));
  ref.bind(ctx, {.capture = {.step = 0, .layers = true}});
  const SampleResult rr = ref.sample({.steps = 1, .seed = 11, .all_steps = true});
  for (const char* format : {"bf16", "fp8"}) {
    Session s(Model::load(ck, "cuda_emu", emu_options(format)));
    s.bind(ctx, {.capture = {.step = 0, .layers = true}});
    const SampleResult r = s.sample({.steps = 1, .seed = 11, .all_steps = true});
    const ErrorModel em =
        error_model_for(ck->weights(), ck->config(), cs.P + ck->config().T, "bf16", format, "f32");
    for (int l = 0; l < 2; ++l)
      expect_within(compare(s.captures().layers[l], ref.captures().layers[l]), em, depth_layer(l),
                    std::string(format) + " full-width layer " + std::to_string(l));
    expect_within(compare(r.v_steps, rr.v_steps), em, depth_v(2), std::string(format) + " full-width v_0");
  }
}

}  // namespace
}  // namespace alpamayo
