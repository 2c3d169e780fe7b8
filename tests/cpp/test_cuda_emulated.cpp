// The whole cuda backend without a GPU: its model, session, graph capture and replay, cuBLASLt plans and our
// matmul, and every kernel, compiled for the host over the fake CUDA runtime (src/backends/cuda/fake_cuda.h),
// the kernels running in the SIMT emulator. Compared with the reference backend as the conformance suite
// compares a registered backend, on the shapes the emulator runs in seconds. This checks the backend's
// orchestration (buffers, layouts between kernels, split-K outputs, fp8 scales, captures, the Euler loop)
// before a GPU ever runs it; the GPU itself is checked by the conformance suite on `cuda`.
#define ALPAMAYO_SIMT_EMU
#define ALP_ROW_THREADS 64  // fewer emulated threads; the kernels loop over any block width
#define ALPAMAYO_CUDA_EMU
#define ALP_CUDA_NS cuda_emu
#include "backends/cuda/action.cu"
#include "backends/cuda/attention.cu"
#include "backends/cuda/cache.cu"
#include "backends/cuda/cuda_model.cpp"
#include "backends/cuda/cuda_session.cpp"
#include "backends/cuda/cuda_step.cpp"
#include "backends/cuda/cuda_util.cpp"
#include "backends/cuda/gemm.cpp"
#include "backends/cuda/layer.cu"
#include "backends/cuda/skinny_gemm.cu"
#include "conformance_util.h"
#include "model/sampler.h"
#include "test_util.h"

namespace alpamayo {
namespace {

using namespace conformance;

struct EmuRun {
  std::vector<float> x, v_steps, x_steps;
  Captures cap;
  size_t buffer_bytes = 0;
};

// One sample of the emulated cuda backend (seed 11, as conformance::run draws for the reference).
EmuRun run_emulated(const Problem& p, const Context& ctx, int steps, const std::string& format, int capture_step) {
  BackendOptions o;
  o.weights = format;
  validate_weights(p.cfg, p.w);
  auto model = cuda_emu::load_backend(p.cfg, p.w, o);
  auto s = model->new_session();
  Binding b;
  b.kv = ctx.kv();
  b.rope = make_rope_tables(b.kv.valid_len, ctx.rope_delta(), p.cfg.T, p.cfg.d, p.cfg.rope_theta);
  b.capture = {.step = capture_step, .layers = true};
  s->bind(b);
  EmuRun r;
  const size_t n = size_t(b.kv.B) * p.cfg.T * p.cfg.A;
  r.x = gaussian_noise(11, int64_t(n));
  r.v_steps.resize(steps * n);
  r.x_steps.resize((steps + 1) * n);
  const std::vector<float> times = euler_time_grid(steps);
  std::vector<double> secs;
  s->denoise({.x = r.x.data(),
              .times = times.data(),
              .steps = steps,
              .x_steps = r.x_steps.data(),
              .v_steps = r.v_steps.data(),
              .step_seconds = &secs});
  EXPECT_EQ(secs.size(), size_t(steps));
  r.cap = s->captures();
  r.buffer_bytes = s->buffer_bytes();
  return r;
}

void compare_with_reference(const Shape& sh, const std::string& format, const char* gemm) {
  const std::string at = std::string("emulated cuda/") + format + " (" + gemm + ") " + sh.name;
  setenv("ALPAMAYO_CUDA_GEMM", gemm, 1);
  Problem p(sh);
  const RunOut ref = run(p.model("reference", "f32"), p.context(), 0);
  const EmuRun got = run_emulated(p, p.context(), sh.steps, format, 0);
  unsetenv("ALPAMAYO_CUDA_GEMM");
  // cuBLASLt's fp8 path quantizes the activations too (W8A8): e4m3 matmul inputs.
  const bool w8a8 = format == "fp8" && std::string(gemm) == "cublaslt";
  const ErrorModel em = error_model_for(p, w8a8 ? "fp8" : "bf16", format, "f32");
  ASSERT_EQ(got.cap.step, 0) << at;
  ASSERT_EQ(got.cap.layers.size(), size_t(sh.L)) << at;
  expect_within(compare(got.cap.emb, ref.cap.emb), em, depth_emb(), at + " action_in_proj output");
  for (int l = 0; l < sh.L; ++l)
    expect_within(compare(got.cap.layers[l], ref.cap.layers[l]), em, depth_layer(l), at + " layer " + std::to_string(l));
  expect_within(compare(got.cap.hidden, ref.cap.hidden), em, depth_hidden(sh.L), at + " final hidden");
  const size_t n = got.x.size();
  const auto oracle = p.model("reference", "f32");
  const std::vector<float> vt = teacher_forced_v(*oracle, p.context(), got.x_steps, sh.steps);
  for (int k = 0; k < sh.steps; ++k)
    expect_within(compare(got.v_steps.data() + k * n, vt.data() + k * n, n), em, depth_v(sh.L),
                  at + " v_" + std::to_string(k) + " (teacher-forced)");
  EXPECT_EQ(std::vector<float>(got.x_steps.end() - n, got.x_steps.end()), got.x) << at;
}

TEST(CudaEmulated, MatchesTheReference) {
  const Shape& gqa = shapes()[1];  // GQA 2:1, d = 64, B = 3 with S_b = 0, 17, 40: NaN padding, ragged rows
  compare_with_reference(gqa, "bf16", "cublaslt");
  compare_with_reference(gqa, "fp8", "own");
}

TEST(CudaEmulated, OtherMatmulsAndShapes) {
  compare_with_reference(shapes()[1], "bf16", "own");
  compare_with_reference(shapes()[1], "fp8", "cublaslt");
  compare_with_reference(shapes()[3], "bf16", "cublaslt");  // d = 48, T = 5, a sample without cache rows
}

TEST(CudaEmulated, LongerCachesAndMoreTokens) {
  compare_with_reference(shapes()[2], "bf16", "cublaslt");  // d = 128, 650 rows: the keys split over items
  compare_with_reference(shapes()[4], "fp8", "own");        // T = 64: 128 query rows per KV head, 3 layers
}

// The cache from "device" memory of the fake runtime: bound in place (no upload), bitwise the host-bound
// result; NaN in one of its valid rows is found by the device-side scan.
TEST(CudaEmulated, DeviceCacheInPlaceAndScanned) {
  const Shape& sh = shapes()[1];
  Problem p(sh);
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
  const Context dev = Context::from_views(kv, host.rope_delta(), std::nullopt, std::vector<float>(kv.B, 3.f), "dev");
  const EmuRun a = run_emulated(p, host, 2, "bf16", 1), b = run_emulated(p, dev, 2, "bf16", 1);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.cap.layers, b.cap.layers);
  EXPECT_GT(a.buffer_bytes, b.buffer_bytes);  // the host cache was uploaded, the device cache not

  uint16_t* v1 = static_cast<uint16_t*>(const_cast<void*>(kv.value[1].data));
  v1[((size_t(2) * sh.Hkv + 1) * sh.ctx.P + 39) * sh.d + 7] = 0x7f80;  // +Inf in sample 2's last valid row
  const Context bad = Context::from_views(kv, host.rope_delta(), std::nullopt, std::vector<float>(kv.B, 3.f), "dev");
  test::expect_error([&] { run_emulated(p, bad, 1, "bf16", -1); }, {kv.value[1].name, "non-finite", "[2, 1, 39, 7]"});
  // A view that claims device memory but points at host memory.
  KVCache lie = host.kv();
  lie.key[0].device = {DeviceType::CUDA, 0};
  const Context lying = Context::from_views(lie, host.rope_delta(), std::nullopt, std::vector<float>(kv.B, 3.f), "lie");
  test::expect_error([&] { run_emulated(p, lying, 1, "bf16", -1); }, {lie.key[0].name, "cuda:0", "host memory"});
  for (void* d : bufs) fake_cuda::Free(d);
}

TEST(CudaEmulated, GraphReplayEqualsEagerLaunches) {
  Problem p(shapes()[1]);
  setenv("ALPAMAYO_CUDA_GRAPHS", "0", 1);
  const EmuRun eager = run_emulated(p, p.context(), 2, "fp8", 1);
  unsetenv("ALPAMAYO_CUDA_GRAPHS");
  const EmuRun graph = run_emulated(p, p.context(), 2, "fp8", 1);
  EXPECT_EQ(eager.x, graph.x);
  EXPECT_EQ(eager.v_steps, graph.v_steps);
  EXPECT_EQ(eager.cap.layers, graph.cap.layers);
}

}  // namespace
}  // namespace alpamayo

namespace alpamayo {
namespace {

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
  const ModelWeights w = ck->weights();
  Session ref(Model::load(ck, "reference"));
  ref.bind(ctx, {.capture = {.step = 0, .layers = true}});
  const SampleResult rr = ref.sample({.steps = 1, .seed = 11, .all_steps = true});
  for (const char* format : {"bf16", "fp8"}) {
    BackendOptions o;
    o.weights = format;
    auto model = cuda_emu::load_backend(ck->config(), w, o);
    auto s = model->new_session();
    Binding b;
    b.kv = ctx.kv();
    b.rope =
        make_rope_tables(b.kv.valid_len, ctx.rope_delta(), ck->config().T, ck->config().d, ck->config().rope_theta);
    b.capture = {.step = 0, .layers = true};
    s->bind(b);
    std::vector<float> x = gaussian_noise(11, int64_t(ck->config().T) * 2), v(x.size());
    const std::vector<float> times = euler_time_grid(1);
    s->denoise({.x = x.data(), .times = times.data(), .steps = 1, .v_steps = v.data()});
    const ErrorModel em = error_model_for(w, ck->config(), cs.P + ck->config().T, "bf16", format, "f32");
    for (int l = 0; l < 2; ++l)
      expect_within(compare(s->captures().layers[l], ref.captures().layers[l]), em, depth_layer(l),
                    std::string(format) + " full-width layer " + std::to_string(l));
    expect_within(compare(v, rr.v_steps), em, depth_v(2), std::string(format) + " full-width v_0");
  }
}

}  // namespace
}  // namespace alpamayo
