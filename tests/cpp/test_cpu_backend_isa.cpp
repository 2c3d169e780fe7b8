// The cpu backend's run-time kernel choice: ISA detection and its caps (BackendOptions::isa_cap, the process
// ceiling), forced kernels (BackendOptions::kernels), the attention kernel's selection, the accuracy check at the
// choice, and the instruction peaks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/environment.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/attention/attention.h"
#include "backends/cpu/cpu_backend_impl.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/matmul/matmul_kernels.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/kernel_check.h"
#include "backends/cpu/kernel_registry.h"
#include "backends/cpu/profile/peaks.h"
#include "test_util.h"

namespace alpamayo::cpu {
namespace {

// ctest's conformance_avx2 reruns part of this suite with ALPAMAYO_CPU_ISA=avx2 and ALPAMAYO_TEST_ONLY_IF_CAPPED=1
// (CMakeLists.txt). The test binary reads ALPAMAYO_CPU_ISA once, here, and makes it the process's ceiling, which
// every model and kernel test of the run stays within. Where that cap takes away nothing this CPU has (no AVX-512,
// no AVX-VNNI), the rerun would repeat the main suite test for test: every test is then skipped, and the reason
// printed.
// The ceiling is set during static initialisation, before gtest evaluates the parameter generators (the op suite
// lists each kernel with why it cannot run, which fixes the ISA): from the variable itself, since listing the
// backends (options_from_environment) here would close the registry before the test-only backends register.
[[maybe_unused]] const bool kCeilingSet = [] {
  if (const char* cap = std::getenv("ALPAMAYO_CPU_ISA"); cap && *cap) set_isa_ceiling(cap, "ALPAMAYO_CPU_ISA");
  return true;
}();

class OnlyIfCapped : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* v = std::getenv("ALPAMAYO_TEST_ONLY_IF_CAPPED");
    if (!v || !*v) return;
    const IsaInfo& i = isa();
    if ((i.detected & ~i.usable) != 0) return;
    std::printf("nothing capped: ALPAMAYO_CPU_ISA=%s leaves every feature this CPU has (%s); the main suite "
                "already ran these paths\n", i.cap.c_str(), isa_names(i.detected).c_str());
    GTEST_SKIP() << "nothing capped";
  }
};
[[maybe_unused]] const ::testing::Environment* const kOnlyIfCapped =
    ::testing::AddGlobalTestEnvironment(new OnlyIfCapped);

TEST(Isa, CapNamesAndErrors) {
  EXPECT_EQ(isa_cap_from_name("avx2"), uint32_t(kAvx2Fma));
  EXPECT_EQ(isa_cap_from_name("avx512"), uint32_t(kAvx2Fma | kAvx512));
  EXPECT_TRUE(isa_cap_from_name("avx512_bf16") & kAvx512Bf16);
  EXPECT_TRUE(isa_cap_from_name("all") & kAmxInt8);
  test::expect_error([] { isa_cap_from_name("avx3"); },
                     {"ALPAMAYO_CPU_ISA=\"avx3\"", "not an instruction-set cap", "avx2, avx2_vnni, avx512", "amx"});
  EXPECT_EQ(isa_names(0), "none");
  EXPECT_EQ(isa_names(kAvx2Fma | kAvx512Bf16), "avx2_fma avx512_bf16");
}

// Whatever this machine has: usable is what was detected, within the cap of ALPAMAYO_CPU_ISA when set (the
// ctest conformance_avx2 runs this suite with ALPAMAYO_CPU_ISA=avx2).
TEST(Isa, UsableIsDetectedWithinTheCap) {
  const IsaInfo& i = isa();
  EXPECT_EQ(i.usable & ~i.detected, 0u);
  const char* env = std::getenv("ALPAMAYO_CPU_ISA");
  if (env && *env) {
    EXPECT_EQ(i.cap, env);
    EXPECT_EQ(i.usable & ~isa_cap_from_name(env), 0u) << i.describe();
    if (i.detected != i.usable) { EXPECT_NE(i.describe().find("[off by ALPAMAYO_CPU_ISA="), std::string::npos); }
  } else {
    EXPECT_EQ(i.usable, i.detected);
  }
  std::printf("isa: %s\n", i.describe().c_str());
}

// A model's cap: within the process's instruction sets, named in messages by where it came from.
TEST(Isa, CapPerModel) {
  const IsaInfo all = isa_with_cap("");
  EXPECT_EQ(all.usable, isa().usable);
  const IsaInfo avx2 = isa_with_cap("avx2");
  EXPECT_EQ(avx2.usable, isa().usable & isa_cap_from_name("avx2"));
  EXPECT_EQ(avx2.cap, "avx2");
  if (avx2.usable != avx2.detected) {
    EXPECT_NE(avx2.describe().find("[off by isa_cap=avx2: "), std::string::npos) << avx2.describe();
    EXPECT_NE(isa_with_cap("avx2", "ALPAMAYO_CPU_ISA").describe().find("[off by ALPAMAYO_CPU_ISA=avx2: "),
              std::string::npos);
  }
  // oneDNN has one instruction set per process: no candidate for a model whose cap takes from it.
  EXPECT_EQ(onednn_within_cap(avx2).empty(), avx2.usable == isa().usable) << onednn_within_cap(avx2);
  EXPECT_EQ(onednn_within_cap(isa()), "");
  EXPECT_EQ(isa().usable, all.usable) << "a model's cap leaves the process's as it was";
  test::expect_error([] { isa_with_cap("avx3"); }, {"isa_cap=\"avx3\" is not an instruction-set cap", "avx2"});
  test::expect_error([] { set_isa_ceiling("avx2", "ALPAMAYO_CPU_ISA"); }, {"after the backend started"});
}

// The boundary: options_from_environment fills what the options leave empty, and only that.
TEST(Isa, OptionsFromEnvironment) {
  test::ScopedEnv k("ALPAMAYO_CPU_KERNELS", "attention=portable");
  test::ScopedEnv i("ALPAMAYO_CPU_ISA", "avx2");
  BackendOptions o;
  options_from_environment(o, "cpu");
  EXPECT_EQ(o.kernels, "attention=portable");
  EXPECT_EQ(o.kernels_source, "ALPAMAYO_CPU_KERNELS");
  EXPECT_EQ(o.isa_cap, "avx2");
  EXPECT_EQ(o.isa_cap_source, "ALPAMAYO_CPU_ISA");
  BackendOptions given;
  given.kernels = "attention=avx2_fma";
  given.isa_cap = "all";
  options_from_environment(given, "cpu");  // the options win over the variables
  EXPECT_EQ(given.kernels, "attention=avx2_fma");
  EXPECT_EQ(given.kernels_source, "");
  EXPECT_EQ(given.isa_cap, "all");
  BackendOptions other;  // the kernels variable is the cpu backend's: other backends have other kernels
  options_from_environment(other, "reference");
  EXPECT_EQ(other.kernels, "");
  EXPECT_EQ(other.isa_cap, "avx2");
  k.set("");
  i.set("");
  BackendOptions none;
  options_from_environment(none, "cpu");
  EXPECT_EQ(none.kernels, "");
  EXPECT_EQ(none.isa_cap, "");
}

// The forced kernels come from the model's option only (the programs fill it from ALPAMAYO_CPU_KERNELS).
TEST(Isa, ForcedKernelParsing) {
  test::ScopedEnv env("ALPAMAYO_CPU_KERNELS", "attention=portable");  // read by nothing under src/ but the boundary
  EXPECT_EQ(forced_kernel("attention", ""), "");
  std::string spec = "attention=avx2_fma,matmul_bf16=onednn";
  EXPECT_EQ(forced_kernel("attention", spec), "avx2_fma");
  EXPECT_EQ(forced_kernel("matmul_bf16", spec), "onednn");
  EXPECT_EQ(forced_kernel("matmul_int8", spec), "");
  EXPECT_EQ(forced_kernel("attention_kv_int8", spec), "");  // select_attention_kernel falls back to "attention"
  spec = "attention_kv_int8=avx512_vnni";
  EXPECT_EQ(forced_kernel("attention_kv_int8", spec), "avx512_vnni");
  EXPECT_EQ(forced_kernel("attention", spec), "");
  test::expect_error([] { forced_kernel("conv", ""); },
                     {"no kernel choice for op \"conv\"", "attention, attention_kv_int8, matmul_bf16"});
  test::expect_error([] { forced_kernel("attention", "attention", "ALPAMAYO_CPU_KERNELS"); },
                     {"ALPAMAYO_CPU_KERNELS=\"attention\"", "is not op=kernel",
                      "attention, attention_kv_int8, matmul_bf16, matmul_int8"});
  test::expect_error([] { forced_kernel("attention", "attention="); }, {"kernels=\"attention=\"", "is not op=kernel"});
  test::expect_error([] { forced_kernel("matmul_int8", "attention=avx2_fma,matmul_bf16=onednn,attention=portable"); },
                     {"op \"attention\" given twice"});
  test::expect_error([] { forced_kernel("matmul_bf16", "attn=avx2_fma"); },
                     {"unknown op \"attn\"", "attention, attention_kv_int8, matmul_bf16"});
}

// What programs without a model choose under (isa(), nothing forced), forcing `kernels` as the CLI passes them.
KernelScope scope(const std::string& kernels = "") {
  KernelScope s = process_kernel_scope();
  s.kernels = kernels;
  s.source = "ALPAMAYO_CPU_KERNELS";
  return s;
}

KernelChoice choice_in(const KernelChoices& made, const std::string& op) {
  for (const KernelChoice& c : made)
    if (c.op == op) return c;
  ADD_FAILURE() << "no choice recorded for " << op;
  return {};
}

TEST(Isa, KernelChoicesReplacePerOp) {
  KernelChoices made;
  record_kernel_choice(made, {"other_op", "x", "first", 1.0, ""});
  record_kernel_choice(made, {"test_op", "a", "first", 1.0, ""});
  record_kernel_choice(made, {"test_op", "b", "second", 2.0, "vfmadd231ps ymm"});
  EXPECT_EQ(made.size(), 2u);
  int n = 0;
  for (const KernelChoice& c : made)
    if (c.op == "test_op") {
      ++n;
      EXPECT_EQ(c.kernel, "b");
      EXPECT_EQ(c.instruction, "vfmadd231ps ymm");
    }
  EXPECT_EQ(n, 1);
}

// "attention" forces both caches' kernel unless "attention_kv_int8" names the int8 cache's; the pin names every
// choice of kKernelOps made in this process, in their order, and forces each to what it was.
TEST(Isa, KernelPinForcesEveryChoiceMade) {
  if (!isa().has(kAvx2Fma)) GTEST_SKIP() << "no AVX2 + FMA: only the portable attention kernel runs here";
  KernelChoices made;
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, true, scope("attention=avx2_fma"), &made), AttnKernel::Avx2Fma);
  const KernelScope both = scope("attention=avx2_fma,attention_kv_int8=portable");
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, false, both, &made), AttnKernel::Avx2Fma);
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, true, both, &made), AttnKernel::Portable);
  record_kernel_choice(made, {"test_op", "a", "first", 1.0, ""});
  const std::string pin = kernel_pin(made);
  EXPECT_EQ(pin, "attention=avx2_fma,attention_kv_int8=portable");
  int pinned = 0;
  for (const KernelChoice& c : made)
    if (c.op != "test_op") {
      EXPECT_EQ(forced_kernel(c.op, pin), c.kernel) << c.op << " in " << pin;
      ++pinned;
    }
  EXPECT_EQ(pinned, 2);
}

// The one choice procedure (kernel_registry.h) on an op of made-up kernels: each with a fixed accuracy and rate.
struct FakeKernel {
  std::string name;
  double ratio, rate;  // worst |d| / bound at the check; GFLOP/s
  std::string why_not;
};
class FakeBench final : public KernelBench {
 public:
  FakeBench(std::vector<FakeKernel> k, int* built) : k_(std::move(k)) { ++*built; }
  std::string shape() const override { return "fake shape"; }
  KernelAccuracy check(const std::string& name, std::string* fail) override {
    KernelAccuracy a;
    a.ratio = of(name).ratio;
    *fail = a.ok() ? "" : name + " too far off";
    return a;
  }
  double rate(const std::string& name, bool) override { return of(name).rate; }

 private:
  const FakeKernel& of(const std::string& name) const {
    for (const FakeKernel& k : k_)
      if (k.name == name) return k;
    throw Error("no fake kernel " + name);
  }
  std::vector<FakeKernel> k_;
};

KernelOp fake_op(const std::vector<FakeKernel>& kernels, const std::string& key, int* built) {
  KernelOp op;
  op.op = "attention";  // an op of kKernelOps, on a timing shape of its own (cache_key)
  op.yardstick = "portable";
  op.cache_key = "fake " + key;
  for (const FakeKernel& k : kernels) op.candidates.push_back({k.name, "instr_" + k.name, k.why_not});
  op.bench = [kernels, built] { return std::make_unique<FakeBench>(kernels, built); };
  return op;
}

// bf16 weights: amx_bf16 is timed before oneDNN (a rule: it streams the weights faster, which the warm slice does
// not show), so oneDNN is taken over it only where more than kChoiceMargin times faster on that slice.
TEST(KernelRegistry, AmxBf16MatmulIsTimedBeforeOnednn) {
  const KernelChoice c = select_matmul_kernel(WeightType::BF16, kRepModelDim, scope());
  std::printf("%s\n", format_kernel_choice(c).c_str());
  const size_t amx = c.why.find(" amx_bf16 "), dnn = c.why.find(" onednn ");
  if (amx == std::string::npos || dnn == std::string::npos) GTEST_SKIP() << "not both timed here: " << c.why;
  EXPECT_LT(amx, dnn) << c.why;
  const double amx_rate = std::stod(c.why.substr(amx + 10)), dnn_rate = std::stod(c.why.substr(dnn + 8));
  if (c.kernel == "onednn") EXPECT_GT(dnn_rate, kChoiceMargin * amx_rate) << c.why;
  if (c.kernel == "amx_bf16") EXPECT_LE(dnn_rate, kChoiceMargin * amx_rate) << c.why;
}

TEST(KernelRegistry, OneProcedureChecksTimesPicksAndForces) {
  const std::vector<FakeKernel> k = {{"wrong", 3.0, 900, ""},    // fastest, but beyond its bound
                                     {"first", 0.1, 100, ""},    // preferred
                                     {"close", 0.2, 120, ""},    // faster, within the margin: not taken
                                     {"absent", 0.0, 999, "needs a unit this CPU lacks"},
                                     {"portable", 0.0, 10, ""}};
  int built = 0;
  const KernelScope none = process_kernel_scope();
  KernelChoice c = choose_kernel(fake_op(k, "a", &built), none);
  EXPECT_EQ(c.kernel, "first");
  EXPECT_EQ(c.instruction, "instr_first");
  EXPECT_EQ(c.why, "fastest of first 100.0, close 120.0 GFLOP/s (1 thread, fake shape)");
  EXPECT_EQ(c.gflops, 100);
  EXPECT_EQ(c.check, "checked against portable on fake shape, worst |d| / bound: first 0.1, close 0.2; rejected: "
                     "wrong too far off");
  EXPECT_EQ(choose_kernel(fake_op(k, "a", &built), none).why, c.why);  // cached: measured once
  EXPECT_EQ(built, 1);
  // A later candidate more than kChoiceMargin times faster wins.
  std::vector<FakeKernel> k2 = k;
  k2[2].rate = 100 * kChoiceMargin * 1.01;
  EXPECT_EQ(choose_kernel(fake_op(k2, "b", &built), none).kernel, "close");
  // Forced: checked, not timed (unless the op times lone kernels), named with its source; errors name the
  // candidates.
  KernelScope forced = none;
  forced.kernels = "attention=close";
  c = choose_kernel(fake_op(k, "a", &built), forced);
  EXPECT_EQ(c.kernel, "close");
  EXPECT_EQ(c.why, "forced by kernels");
  EXPECT_EQ(c.gflops, 0);
  EXPECT_EQ(c.check, "checked against portable on fake shape, worst |d| / bound: close 0.2");
  forced.kernels = "attention=wrong";
  test::expect_error([&] { choose_kernel(fake_op(k, "a", &built), forced); },
                     {"kernels: attention=wrong fails the accuracy check: wrong too far off"});
  forced.kernels = "attention=absent";
  test::expect_error([&] { choose_kernel(fake_op(k, "a", &built), forced); },
                     {"attention=absent cannot be used: needs a unit this CPU lacks", "Candidates: wrong (runs here)",
                      "absent (not here: needs a unit this CPU lacks)"});
  forced.kernels = "attention=nothing";
  test::expect_error([&] { choose_kernel(fake_op(k, "a", &built), forced); }, {"unknown kernel", "Candidates"});
  // Only the yardstick runs, or only it passes.
  const std::vector<FakeKernel> lone = {{"absent", 0.0, 999, "no"}, {"portable", 0.0, 10, ""}};
  c = choose_kernel(fake_op(lone, "c", &built), none);
  EXPECT_EQ(c.kernel, "portable");
  EXPECT_EQ(c.why, "only one");
  EXPECT_EQ(c.check, "");
  const std::vector<FakeKernel> bad = {{"wrong", 2.0, 999, ""}, {"portable", 0.0, 10, ""}};
  c = choose_kernel(fake_op(bad, "d", &built), none);
  EXPECT_EQ(c.kernel, "portable");
  EXPECT_EQ(c.why, "the only kernel that passes the accuracy check");
  EXPECT_NE(c.check.find("rejected: wrong too far off"), std::string::npos) << c.check;
}

TEST(AttentionSelection, NamesAndAvailability) {
  EXPECT_TRUE(attn_kernel_unavailable(AttnKernel::Portable).empty());
  for (AttnKernel k : kAttnKernels)
    if (attn_kernel_unavailable(k).empty()) { EXPECT_EQ(attn_kernel_from_name(attn_kernel_name(k), "test"), k); }
}

TEST(AttentionSelection, UnknownOrUnrunnableNamesAreErrors) {
  test::expect_error([] { attn_kernel_from_name("amx", "ALPAMAYO_CPU_KERNELS"); },
                     {"ALPAMAYO_CPU_KERNELS", "unknown attention kernel \"amx\"",
                      "avx512_bf16, avx512_vnni, avx512_fma, avx2_fma, amx_bf16, portable", "runnable here"});
  for (bool int8 : {false, true})
    for (AttnKernel k : kAttnKernels)
      if (const std::string why = attn_kernel_unavailable(k, int8); !why.empty()) {
        test::expect_error([&] { attn_kernel_from_name(attn_kernel_name(k), "ALPAMAYO_CPU_KERNELS", int8); },
                           {"\"" + std::string(attn_kernel_name(k)) + "\" cannot run here", why, "portable"});
        std::printf("attention kernel %s not runnable here on a%s cache: %s\n", attn_kernel_name(k),
                    int8 ? "n int8" : " bf16", why.c_str());
      }
  // Each cache has its own dot-product kernel; the fp32 and portable kernels read both.
  EXPECT_NE(attn_kernel_unavailable(AttnKernel::Avx512Vnni, false), "");
  EXPECT_NE(attn_kernel_unavailable(AttnKernel::Avx512Bf16, true), "");
  EXPECT_EQ(attn_kernel_unavailable(AttnKernel::Portable, true), "");
}

// amx_bf16 runs exactly where isa() has AMX-BF16 (the CPU has it and Linux granted the tile state) with AVX512-BF16,
// on both caches, and a cap below amx takes it away, naming the cap.
TEST(AttentionSelection, AmxNeedsTheTilesAndIsCappedBelowAmx) {
  const bool usable = isa().has(kAvx512 | kAvx512Bf16 | kAmxBf16);
  for (bool int8 : {false, true}) {
    EXPECT_EQ(attn_kernel_unavailable(AttnKernel::AmxBf16, int8).empty(), usable) << int8;
    for (const char* cap : {"avx2", "avx512", "avx512_vnni", "avx512_bf16"}) {
      const std::string why = attn_kernel_unavailable(AttnKernel::AmxBf16, int8, isa_with_cap(cap, "ALPAMAYO_CPU_ISA"));
      EXPECT_NE(why.find("amx_bf16"), std::string::npos) << cap << ": " << why;
      if (usable) { EXPECT_NE(why.find("ALPAMAYO_CPU_ISA=" + std::string(cap)), std::string::npos) << why; }
      test::expect_error(
          [&] { attn_kernel_from_name("amx_bf16", "ALPAMAYO_CPU_KERNELS", int8, isa_with_cap(cap, "ALPAMAYO_CPU_ISA")); },
          {"\"amx_bf16\" cannot run here", "needs"});
    }
    EXPECT_EQ(attn_kernel_unavailable(AttnKernel::AmxBf16, int8, isa_with_cap("amx", "ALPAMAYO_CPU_ISA")).empty(),
              usable);
  }
  std::printf("amx_bf16 %s\n", usable ? "runs here" : attn_kernel_unavailable(AttnKernel::AmxBf16).c_str());
}

TEST(AttentionSelection, FastestRunnableOrForced) {
  KernelChoices made;
  const AttnKernel k = select_attention_kernel(64, 2, 8, 512, false, scope(), &made);
  EXPECT_TRUE(attn_kernel_unavailable(k).empty());
  if (isa().has(kAvx2Fma)) { EXPECT_NE(k, AttnKernel::Portable) << "a vectorised kernel runs on every AVX2 CPU"; }
  bool found = false;
  for (const KernelChoice& c : made)
    if (c.op == "attention") {
      found = true;
      EXPECT_EQ(c.kernel, attn_kernel_name(k));
      EXPECT_EQ(c.instruction, attn_kernel_instruction(k));
      if (k != AttnKernel::Portable) { EXPECT_GT(c.gflops, 0.0); }
      std::printf("attention: %s (%s)\n", c.kernel.c_str(), c.why.c_str());
    }
  EXPECT_TRUE(found);
  // Cached: the same shape again picks the same kernel without timing.
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, false, scope(), nullptr), k);
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, false, scope("attention=portable"), nullptr), AttnKernel::Portable);
  test::expect_error([] { select_attention_kernel(64, 2, 8, 512, false, scope("attention=fastest"), nullptr); },
                     {"ALPAMAYO_CPU_KERNELS", "unknown attention kernel \"fastest\"", "avx2_fma"});
  // Under a model's cap: only what the cap allows, chosen on its own (a different cache entry).
  const IsaInfo avx2 = isa_with_cap("avx2");
  const AttnKernel capped = select_attention_kernel(64, 2, 8, 512, false, {avx2, "", "kernels"}, &made);
  EXPECT_EQ(attn_kernel_unavailable(capped, false, avx2), "");
  EXPECT_EQ(choice_in(made, "attention").kernel, attn_kernel_name(capped));
}

// The accuracy check at the choice (kernel_check.h, docs/CPU_BACKEND.md "Accuracy check at the choice").

TEST(KernelCheck, AccuracyIsTheWorstElementAgainstItsBound) {
  const std::vector<float> ref = {1.f, 2.f, 3.f, 4.f};
  const std::vector<double> bound = {0.1, 0.1, 0.5, 0.1};
  KernelAccuracy a = kernel_accuracy(ref.data(), ref.data(), bound.data(), ref.size());
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(a.ratio, 0.0);
  std::vector<float> c = {1.05f, 2.f, 3.9f, 4.f};  // 0.5 and 1.8 of their bounds
  a = kernel_accuracy(c.data(), ref.data(), bound.data(), c.size());
  EXPECT_FALSE(a.ok());
  EXPECT_EQ(a.index, 2u);
  EXPECT_NEAR(a.ratio, 1.8, 1e-6);
  EXPECT_NEAR(a.diff, 0.9, 1e-6);
  EXPECT_EQ(a.bound, 0.5);
  c = {1.f, std::numeric_limits<float>::quiet_NaN(), 3.f, 4.f};
  a = kernel_accuracy(c.data(), ref.data(), bound.data(), c.size());
  EXPECT_FALSE(a.ok());
  EXPECT_EQ(a.index, 1u);
  const std::vector<double> zero(4, 0.0);
  EXPECT_TRUE(kernel_accuracy(ref.data(), ref.data(), zero.data(), 4).ok());
  c = {1.f, 2.f, 3.f, 4.0001f};
  EXPECT_FALSE(kernel_accuracy(c.data(), ref.data(), zero.data(), 4).ok());
  const std::string msg = accuracy_failure("k", kernel_accuracy(c.data(), ref.data(), bound.data(), 4), "output (0, 3)",
                                           "portable_fma", "1 x 2 x 4");
  EXPECT_NE(msg.find("k |d| "), std::string::npos) << msg;
  EXPECT_NE(msg.find("against portable_fma on 1 x 2 x 4"), std::string::npos) << msg;
}

// ref + f * bound, the sign alternating: f > 1 must fail at about f times the bound, f < 1 pass.
template <class T>
void expect_power(const std::vector<T>& ref, const std::vector<double>& bound, const std::string& what) {
  for (double f : {3.0, 0.01}) {
    std::vector<T> c(ref.size());
    for (size_t i = 0; i < c.size(); ++i) c[i] = T(ref[i] + (i % 2 ? -f : f) * bound[i]);
    const KernelAccuracy a = kernel_accuracy(c.data(), ref.data(), bound.data(), c.size());
    EXPECT_EQ(a.ok(), f < 1) << what << ": " << f << " times the bound, ratio " << a.ratio;
    EXPECT_NEAR(a.ratio, f, 0.05 * f + 1e-3) << what;  // the float rounding of ref + f * bound
  }
}

// Every runnable matmul kernel on random data is within the bound against portable_fma, with room; the bound is
// small against the outputs (a relative error of 1% exceeds it), and a few times it fails while far below passes.
TEST(KernelCheck, MatmulBoundsHoldAndHavePower) {
  const int M = 16, K = 1000, N = 80;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> W(size_t(N) * K), x(size_t(M) * K);
  for (float& v : W) v = nd(rng);
  for (float& v : x) v = nd(rng);
  std::vector<uint16_t> xb(x.size()), wb(W.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  for (size_t i = 0; i < W.size(); ++i) wb[i] = f32_to_bf16(W[i]);
  std::vector<uint8_t> xq(x.size());
  std::vector<float> rs(M), ws(N);
  quantize_rows(x.data(), 0, M, K, xq.data(), rs.data());
  std::vector<int8_t> wq(W.size());
  quantize_weight_rows(W.data(), K, N, wq.data(), ws.data(), nullptr);
  const Int8Sums sums = int8_sums(xq.data(), wq.data(), M, K, N);
  // Kernel k's output after the epilogue.
  auto run = [&](MatmulKernel k, bool int8) {
    MatmulWeights w;
    if (int8) w.pack_int8(k, W.data(), K, N);
    else w.pack(k, W.data(), K, N);
    std::vector<uint8_t> scratch(matmul_scratch_bytes(k, M, K) + 64);
    void* sp = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
    std::vector<float> y(size_t(M) * N), out(y.size());
    run_matmul(w, int8 ? static_cast<const void*>(xq.data()) : xb.data(), M, K, y.data(), N, sp);
    copy_rows(out.data(), N, y.data(), M, N, int8 ? rs.data() : nullptr, w.col_correction(), w.col_scale());
    return out;
  };
  for (bool int8 : {false, true}) {
    const std::vector<float> ref = run(MatmulKernel::Portable, int8);
    const std::vector<double> bf16_bound = matmul_bf16_bound(xb.data(), wb.data(), M, K, N);
    for (MatmulKernel k : kMatmulKernels) {
      if (!matmul_kernel_refuses(k, int8, K).empty() || !matmul_kernel_runnable(k)) continue;
      const std::vector<double> b =
          int8 ? matmul_int8_bound(sums, rs.data(), ws.data(), int8_sum_of(matmul_kernel_name(k))) : bf16_bound;
      const std::vector<float> y = run(k, int8);
      const KernelAccuracy a = kernel_accuracy(y.data(), ref.data(), b.data(), y.size());
      const std::string what = std::string(matmul_kernel_name(k)) + (int8 ? " int8" : " bf16");
      EXPECT_LT(a.ratio, 0.5) << what;
      std::printf("%-18s worst |d| / bound %.3g\n", what.c_str(), a.ratio);
      expect_power(ref, b, what);
      std::vector<float> off = y;
      for (float& v : off) v *= 1.01f;
      EXPECT_FALSE(kernel_accuracy(off.data(), ref.data(), b.data(), off.size()).ok()) << what << ": 1% off passes";
    }
  }
  // oneDNN's int8 bound allows for its correction's rounding: never below the exact-int32 kernels'.
  const auto exact = matmul_int8_bound(sums, rs.data(), ws.data(), Int8Sum::Int32);
  const auto onednn = matmul_int8_bound(sums, rs.data(), ws.data(), Int8Sum::OnednnU8);
  for (size_t i = 0; i < exact.size(); ++i) ASSERT_GE(onednn[i], exact[i]);
  // The kernels summing in int32 exactly are held to the exact-int32 bound.
  for (const char* k : {"avx512_vnni", "avx2_int8", "amx_int8"}) EXPECT_EQ(int8_sum_of(k), Int8Sum::Int32) << k;
}

// Attention data of unit scale: bf16 queries, cache and own rows, and the same as an int8 cache.
struct AttnTestData {
  AttnGeometry g;
  int n;
  AlignedBuf<uint32_t> qp;  // the kernels load queries and O aligned
  std::vector<uint16_t> k, v;
  std::vector<uint8_t> k8;
  std::vector<int8_t> v8;
  std::vector<float> ks, vs;
  KeyRows kv;
  AttnTestData(int d, int group, int T, int keys, bool int8)
      : g(AttnGeometry::make(d, group, T)), n(keys + T), qp(size_t(d / 2) * g.qld), k(size_t(n) * d), v(k.size()) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> ud(-1.5f, 1.5f);
    for (int i = 0; i < d / 2; ++i)
      for (int r = 0; r < g.R; ++r)
        qp[size_t(i) * g.qld + r] = uint32_t(f32_to_bf16(ud(rng))) | uint32_t(f32_to_bf16(ud(rng))) << 16;
    for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_bf16(ud(rng)), v[i] = f32_to_bf16(ud(rng));
    // Rows [0, keys) are the cache, [keys, n) the own rows.
    kv.k_cache = k.data();
    kv.v_cache = v.data();
    kv.S = keys;
    kv.k_own = k.data() + size_t(keys) * d;
    kv.v_own = v.data() + size_t(keys) * d;
    if (int8) {
      k8.resize(k.size()), v8.resize(k.size()), ks.resize(n), vs.resize(n);
      store_int8_rows(k.data(), v.data(), n, d, k8.data(), v8.data(), ks.data(), vs.data());
      kv.int8 = true;
      kv.i8[0] = {k8.data(), v8.data(), ks.data(), vs.data()};
      kv.i8[2] = {k8.data() + size_t(keys) * d, v8.data() + size_t(keys) * d, ks.data() + keys, vs.data() + keys};
    }
  }
  // Kernel k's O / l [R][d] and l 2^m [R], in double as the check computes them.
  void run(AttnKernel kernel, std::vector<double>& out, std::vector<double>& norm) const {
    AttnScratch sc;
    sc.resize(g, attn_kernel_is_fp32(kernel), kv.int8, attn_kernel_is_amx(kernel));
    AlignedBuf<float> O(size_t(g.Rp) * g.dp), m(g.Rp), l(g.Rp);
    init_partial(g, O.data(), m.data(), l.data());
    attend_chunk(kernel, g, qp.data(), kv, 0, n, O.data(), m.data(), l.data(), sc);
    out.resize(size_t(g.R) * g.d);
    norm.resize(g.R);
    for (int r = 0; r < g.R; ++r) {
      for (int c = 0; c < g.d; ++c) out[size_t(r) * g.d + c] = double(O[size_t(r) * g.dp + c]) / l[r];
      norm[r] = double(l[r]) * std::exp2(double(m[r]));
    }
  }
};

TEST(KernelCheck, AttentionBoundsHoldAndHavePower) {
  for (bool int8 : {false, true}) {
    const AttnTestData data(64, 2, 8, 500, int8);
    const AttnReference ref = attention_reference(data.g, data.qp.data(), data.kv, data.n);
    std::vector<double> pout, pnorm;
    data.run(AttnKernel::Portable, pout, pnorm);
    // Against the exact output, portable is within its own share of the bound (E_p: half the bound against itself).
    const AttnBound self = attention_bound(ref, AttnKernel::Portable);
    std::vector<double> half(self.out.size());
    for (size_t i = 0; i < half.size(); ++i) half[i] = self.out[i] / 2;
    EXPECT_TRUE(kernel_accuracy(pout.data(), ref.out.data(), half.data(), pout.size()).ok());
    for (AttnKernel k : kAttnKernels) {
      if (!attn_kernel_unavailable(k, int8).empty()) continue;
      const std::string what = std::string(attn_kernel_name(k)) + (int8 ? " int8 cache" : " bf16 cache");
      std::vector<double> out, norm;
      data.run(k, out, norm);
      const AttnBound b = attention_bound(ref, k);
      const KernelAccuracy a = kernel_accuracy(out.data(), pout.data(), b.out.data(), out.size());
      const KernelAccuracy an = kernel_accuracy(norm.data(), pnorm.data(), b.norm.data(), norm.size());
      EXPECT_LT(a.ratio, 0.5) << what;
      EXPECT_LT(an.ratio, 0.5) << what;
      std::printf("%-24s worst |d| / bound %.3g (outputs), %.3g (normalisers)\n", what.c_str(), a.ratio, an.ratio);
      expect_power(pout, b.out, what);
    }
  }
}

// The timing data's check as the choice runs it: every candidate that runs here passes, and the choice says so.
TEST(KernelCheck, EveryRunnableCandidatePassesAtTheChoice) {
  KernelChoices made;
  record_kernel_choice(made, select_matmul_kernel(WeightType::BF16, kRepModelDim, scope()));
  record_kernel_choice(made, select_matmul_kernel(WeightType::INT8, kRepModelDim, scope()));
  for (bool int8 : {false, true}) select_attention_kernel(64, 2, 8, 512, int8, scope(), &made);
  int n = 0;
  for (const KernelChoice& c : made) {
    std::printf("%s\n%s\n", format_kernel_choice(c).c_str(), format_kernel_check(c).c_str());
    EXPECT_EQ(c.check.find("rejected"), std::string::npos) << c.op << ": " << c.check;
    if (c.kernel != "portable" && c.kernel != "portable_fma") {
      ++n;
      const std::string want =
          c.op.rfind("matmul", 0) == 0 ? "checked against portable_fma on " : "checked against portable on ";
      EXPECT_EQ(c.check.find(want), 0u) << c.op << ": " << c.check;
      EXPECT_NE(c.check.find(" " + c.kernel + " "), std::string::npos) << c.op << ": " << c.check;  // its ratio
      EXPECT_NE(format_kernel_check(c).find(c.check), std::string::npos);
    }
  }
  if (isa().has(kAvx2Fma)) { EXPECT_EQ(n, 4); }
  // Forced, each runnable candidate passes too and says so.
  const std::vector<std::pair<std::string, std::vector<std::string>>> ops = {
      {"matmul_bf16", {"amx_bf16", "avx512_bf16", "onednn", "avx512_fma", "avx2_fma"}},
      {"matmul_int8", {"avx512_vnni", "avx2_int8", "amx_int8", "onednn", "avx512_fma", "avx2_fma"}},
      {"attention", {"avx512_bf16", "avx512_fma", "avx2_fma", "amx_bf16"}},
      {"attention_kv_int8", {"avx512_vnni", "avx512_fma", "avx2_fma", "amx_bf16"}}};
  for (const auto& [op, kernels] : ops)
    for (const std::string& k : kernels) {
      const KernelScope forced = scope(op + "=" + k);
      try {
        if (op.rfind("matmul", 0) == 0)
          record_kernel_choice(made, select_matmul_kernel(op == "matmul_int8" ? WeightType::INT8 : WeightType::BF16,
                                                          kRepModelDim, forced));
        else select_attention_kernel(64, 2, 8, 512, op == "attention_kv_int8", forced, &made);
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.find("accuracy"), std::string::npos) << msg;  // only "cannot run here" may refuse it
        continue;
      }
      for (const KernelChoice& c : made)
        if (c.op == op) {
          EXPECT_EQ(c.kernel, k);
          EXPECT_EQ(c.why, "forced by ALPAMAYO_CPU_KERNELS");
          EXPECT_EQ(c.check.find("checked against portable"), 0u) << c.check;
          std::printf("forced %s\n", format_kernel_check(c).c_str());
        }
    }
}

// Test-only: perturbs one candidate's output at the check while in scope.
class ScopedPerturbation {
 public:
  ScopedPerturbation(std::string op, std::string kernel, double relative)
      : op_(std::move(op)), kernel_(std::move(kernel)) {
    set_kernel_check_perturbation_for_testing(op_, kernel_, relative);
  }
  ~ScopedPerturbation() { set_kernel_check_perturbation_for_testing(op_, kernel_, 0); }

 private:
  std::string op_, kernel_;
};

// A candidate whose output is off is left out of the timing, named as rejected with its difference and bound, and
// forcing it is an error; far below the bound it passes; without the perturbation the earlier choice is back.
TEST(KernelCheck, InaccurateCandidateIsRejectedAndNamed) {
  if (!isa().has(kAvx2Fma)) GTEST_SKIP() << "no AVX2 + FMA: only the portable kernels run here";
  KernelChoices made;
  std::string spec;  // forced kernels of the selections below
  auto choice_of = [&](const std::string& op) { return choice_in(made, op); };
  struct Op {
    std::string op;
    double relative;  // far beyond the op's bound on the timing data (the test prints how far)
    std::function<void()> select;
  };
  const std::vector<Op> ops = {
      {"matmul_bf16", 1e-2,
       [&] { record_kernel_choice(made, select_matmul_kernel(WeightType::BF16, kRepModelDim, scope(spec))); }},
      {"matmul_int8", 1e-2,
       [&] { record_kernel_choice(made, select_matmul_kernel(WeightType::INT8, kRepModelDim, scope(spec))); }},
      {"attention", 1.0, [&] { select_attention_kernel(64, 2, 8, 512, false, scope(spec), &made); }},
      {"attention_kv_int8", 1.0, [&] { select_attention_kernel(64, 2, 8, 512, true, scope(spec), &made); }}};
  for (const Op& o : ops) {
    o.select();
    const KernelChoice before = choice_of(o.op);
    const std::string k = before.kernel;
    if (k == "portable" || k == "portable_fma") continue;  // the yardstick
    {
      ScopedPerturbation p(o.op, k, o.relative);
      o.select();
      const KernelChoice c = choice_of(o.op);
      const std::string line = format_kernel_check(c);
      std::printf("perturbed %s by %g: %s\n", k.c_str(), o.relative, line.c_str());
      EXPECT_NE(c.kernel, k) << line;
      EXPECT_NE(line.find("rejected: " + k + " |d| "), std::string::npos) << line;
      EXPECT_NE(line.find(" > bound "), std::string::npos) << line;
      EXPECT_NE(line.find(o.op.rfind("matmul", 0) == 0 ? "against portable_fma on 64 x 1536 x 1024"
                                                       : "against portable on d=64, 16 rows, 520 keys"),
                std::string::npos)
          << line;
      spec = o.op + "=" + k;
      test::expect_error(o.select, {"ALPAMAYO_CPU_KERNELS: " + o.op + "=" + k, "fails the accuracy check",
                                    k + " |d| ", " > bound ", "times the bound"});
      spec = "";
    }
    {
      ScopedPerturbation p(o.op, k, 1e-7 * o.relative);  // far below the bound
      o.select();
      EXPECT_EQ(choice_of(o.op).check.find("rejected"), std::string::npos) << choice_of(o.op).check;
    }
    o.select();  // cached: the unperturbed choice again
    EXPECT_EQ(choice_of(o.op).kernel, k);
    EXPECT_EQ(choice_of(o.op).why, before.why);
    EXPECT_EQ(choice_of(o.op).check, before.check);
  }
}

TEST(Peaks, MeasuredWhereRunnable) {
  const Peaks& p = measured_peaks(1);
  EXPECT_EQ(&p, &measured_peaks(1));  // cached
  ASSERT_EQ(p.entries.size(), 9u);
  for (const PeakEntry& e : p.entries) {
    std::printf("  %-16s %8.1f %s %s\n", e.instruction.c_str(), e.rate, e.unit.c_str(), e.why_not.c_str());
    if (e.why_not.empty())
      EXPECT_GT(e.rate, 1.0) << e.instruction;  // any CPU of the last decade does > 1 GFLOP/s per core
    else
      EXPECT_EQ(e.rate, 0.0) << e.instruction;
  }
  EXPECT_EQ(p.of("vfmadd231ps ymm") > 0, isa().has(kAvx2Fma));
  EXPECT_EQ(p.of("vdpbf16ps zmm") > 0, isa().has(kAvx512 | kAvx512Bf16));
  EXPECT_EQ(p.of("tdpbf16ps tmm") > 0, isa().has(kAvx512 | kAmxBf16));
  EXPECT_EQ(p.of("tdpbusd tmm") > 0, isa().has(kAvx512 | kAmxInt8));
  EXPECT_GE(p.best_bf16_unit(), p.of("vfmadd231ps ymm"));
  EXPECT_GE(p.best_bf16_unit(), p.of("tdpbf16ps tmm"));
  EXPECT_GE(p.best_int8_unit(), p.of("tdpbusd tmm"));
  // Streaming reads from memory: any machine of the last decade reads > 1 GB/s per core, and no single core
  // of today reads 1000 GB/s from DRAM (the buffer is several times the last-level cache).
  printf("  read %.1f GB/s\n", p.read_gbs);
  EXPECT_GT(p.read_gbs, 1.0);
  EXPECT_LT(p.read_gbs, 1000.0);
  EXPECT_EQ(p.of("vpmaddwd ymm") > 0, isa().has(kAvx2Fma));
  EXPECT_GE(p.best_int8_unit(), p.of("vpmaddwd ymm"));
  // A kernel doing half its work on each of two instructions: their harmonic mean.
  const double a = p.of("vpdpbusd zmm"), b = p.of("vpdpwssd zmm");
  if (a > 0 && b > 0) EXPECT_NEAR(p.of("vpdpbusd zmm + vpdpwssd zmm"), 2 / (1 / a + 1 / b), 1e-9 * a);
  else EXPECT_EQ(p.of("vpdpbusd zmm + vpdpwssd zmm"), 0.0);
}

// remeasure_peaks: the same cached object, every rate the best so far (never lower).
TEST(Peaks, RemeasureKeepsTheBest) {
  std::vector<double> before;
  for (const PeakEntry& e : measured_peaks(1).entries) before.push_back(e.rate);
  const Peaks& again = remeasure_peaks(1);
  EXPECT_EQ(&again, &measured_peaks(1));
  ASSERT_EQ(again.entries.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_GE(again.entries[i].rate, before[i]) << again.entries[i].instruction;
    EXPECT_EQ(again.entries[i].rate > 0, before[i] > 0) << again.entries[i].instruction;
  }
}

TEST(Peaks, StepFloorFromTheConfig) {
  // The full-size expert (L=64, D=1536, 16/8 heads of 128, I=6144), one sample of 64 tokens, 4700 cache rows:
  // the 309 GFLOP of weight matmuls and 158 GFLOP of attention; 4.83 GB of bf16 weights.
  const StepWork w = step_work(64, 1536, 16, 8, 128, 6144, 64, {4700 + 64});
  EXPECT_NEAR(w.matmul_gflop, 309, 2);
  EXPECT_NEAR(w.attention_gflop, 160, 3);
  EXPECT_NEAR(w.matmul_weight_gbytes, 4.83, 0.01);
  // + the activations: 64 rows of bf16 inputs (K = 1536, 2048, 1536, 6144) and fp32 outputs (N = 4096, 1536,
  // 12288, 1536) per layer.
  EXPECT_NEAR(w.matmul_gbytes - w.matmul_weight_gbytes, 64 * 64 * (11264 * 2 + 19456 * 4) * 1e-9, 1e-9);
  const KernelChoices chosen = {{"matmul_bf16", "avx2_fma", "", 0.0, "vfmadd231ps ymm"},
                                {"attention", "avx2_fma", "", 0.0, "vfmadd231ps ymm"}};
  const auto f = step_floors(w, chosen, "bf16", 1);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].op, "matmul_bf16");
  EXPECT_EQ(f[1].op, "attention");
  for (const OpFloor& o : f)
    if (o.peak > 0 && o.read_gbs > 0) {
      EXPECT_NEAR(o.compute_ms, 1e3 * o.gflop / o.peak, 1e-9 * o.compute_ms);
      EXPECT_NEAR(o.memory_ms, 1e3 * o.gbytes / o.read_gbs, 1e-9 * o.memory_ms);
      EXPECT_GE(o.floor_ms, std::max(o.compute_ms, o.memory_ms) * (1 - 1e-12));
    }
  const std::string table = format_floors(f, 1, "  ");
  EXPECT_NE(table.find("matmul_bf16"), std::string::npos) << table;
  EXPECT_NE(table.find("floor"), std::string::npos) << table;
}

// Hand-made peaks: the floor model is a plain function of them.
Peaks given_peaks(double amx_bf16, double fma_ymm, double amx_int8, double read_gbs) {
  Peaks p;
  p.threads = 2;
  p.entries = {{"tdpbf16ps tmm", "GFLOP/s", amx_bf16, "", kAvx512 | kAmxBf16},
               {"vfmadd231ps ymm", "GFLOP/s", fma_ymm, "", kAvx2Fma},
               {"tdpbusd tmm", "GOP/s", amx_int8, "", kAvx512 | kAmxInt8}};
  p.read_gbs = read_gbs;
  return p;
}

// Bytes: the weights once (bf16 2 bytes, int8 1), the activations, and the distinct cache rows (K and V).
TEST(Roofline, BytesOfAStep) {
  // L=2, D=4, 2/1 heads of 2, I=8: per layer qkv 4 x 8, o_proj 4 x 4, gate_up 4 x 16, down 8 x 4 = 144 weights.
  const std::vector<long long> att = {10, 30};  // two samples of T = 3
  const StepWork b = step_work(2, 4, 2, 1, 2, 8, 3, att, "bf16");
  ASSERT_EQ(b.matmul_phases.size(), 4u);
  EXPECT_EQ(b.matmul_phases[2].phase, "gate_up");
  // gate_up: M = 6 rows, K = 4, N = 16: weights 64 x 2 bytes, input 6 x 4 x 2, output 6 x 16 x 4, per layer.
  EXPECT_NEAR(b.matmul_phases[2].gbytes, 2 * (128 + 48 + 384) * 1e-9, 1e-18);
  EXPECT_NEAR(b.matmul_phases[2].gflop, 2 * (2.0 * 6 * 4 * 16) * 1e-9, 1e-18);
  const StepWork i8 = step_work(2, 4, 2, 1, 2, 8, 3, att, "int8");
  EXPECT_NEAR(i8.matmul_phases[2].gbytes, 2 * (64 + 24 + 384) * 1e-9, 1e-18);
  // Attention: 40 rows x Hkv 1 x d 2 x (K, V) x 2 bytes x 2 layers; int8 cache 1 byte; a shared prompt once.
  EXPECT_NEAR(b.attention_gbytes, 40 * 2 * 2 * 2 * 2 * 1e-9, 1e-18);
  EXPECT_NEAR(step_work(2, 4, 2, 1, 2, 8, 3, att, "bf16", true).attention_gbytes, 40 * 2 * 2 * 2 * 1e-9, 1e-18);
  EXPECT_NEAR(step_work(2, 4, 2, 1, 2, 8, 3, att, "bf16", false, 25).attention_gbytes, 25 * 2 * 2 * 2 * 2 * 1e-9,
              1e-18);
  EXPECT_EQ(weight_bytes_per_param("bfp8_b"), 1.0625);
  EXPECT_EQ(weight_bytes_per_param("bfp4_b"), 0.5625);
}

TEST(Roofline, FloorPerPhaseIsTheLargerOfComputeAndMemory) {
  const StepWork w = step_work(64, 1536, 16, 8, 128, 6144, 64, {4700 + 64});
  // oneDNN (no instruction recorded) is held to the fastest bf16 unit, here AMX; at 64 rows the weights' bytes
  // at 25 GB/s take longer than their flops at 7000 GFLOP/s: memory-bound.
  const Peaks p = given_peaks(7000, 200, 14000, 25);
  const KernelChoices chosen = {{"matmul_bf16", "onednn", "", 0.0, ""},
                                {"attention", "avx2_fma", "", 0.0, "vfmadd231ps ymm"}};
  const std::vector<OpFloor> f = step_floors(w, chosen, "bf16", p);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].instruction, "best: tdpbf16ps tmm");
  EXPECT_EQ(f[0].peak, 7000);
  EXPECT_NEAR(f[0].memory_ms, 1e3 * w.matmul_gbytes / 25, 1e-9);
  EXPECT_NEAR(f[0].compute_ms, 1e3 * w.matmul_gflop / 7000, 1e-9);
  EXPECT_STREQ(f[0].bound(), "memory");
  double expect = 0;
  for (const PhaseWork& ph : w.matmul_phases) expect += std::max(1e3 * ph.gflop / 7000, 1e3 * ph.gbytes / 25);
  EXPECT_NEAR(f[0].floor_ms, expect, 1e-9);
  EXPECT_NEAR(f[0].floor_ms, f[0].memory_ms, 1e-9);  // every phase memory-bound
  // Attention on vfmadd231ps ymm: its own instruction's peak, compute-bound.
  EXPECT_EQ(f[1].instruction, "vfmadd231ps ymm");
  EXPECT_EQ(f[1].peak, 200);
  EXPECT_STREQ(f[1].bound(), "compute");
  EXPECT_NEAR(f[1].floor_ms, 1e3 * w.attention_gflop / 200, 1e-9);
  // A slow unit makes the matmuls compute-bound: then the floor is the flops' time.
  const std::vector<OpFloor> slow =
      step_floors(w, {{"matmul_bf16", "avx2_fma", "", 0.0, "vfmadd231ps ymm"}}, "bf16", p);
  EXPECT_STREQ(slow[0].bound(), "compute");
  EXPECT_NEAR(slow[0].floor_ms, 1e3 * w.matmul_gflop / 200, 1e-9);
  // int8 weights: half the bytes, the AMX int8 peak.
  const StepWork w8 = step_work(64, 1536, 16, 8, 128, 6144, 64, {4700 + 64}, "int8");
  const std::vector<OpFloor> f8 = step_floors(w8, {}, "int8", p);
  EXPECT_EQ(f8[0].instruction, "best: tdpbusd tmm");
  EXPECT_NEAR(f8[0].floor_ms, 1e3 * w8.matmul_gbytes / 25, 1e-9);
  EXPECT_LT(f8[0].floor_ms, 0.55 * f[0].floor_ms);
  // An int8 cache's attention without a recorded instruction: the fastest unit, int8 ones included.
  EXPECT_EQ(step_floors(w8, {}, "int8", p, true)[1].instruction, "best: tdpbusd tmm");
  EXPECT_EQ(step_floors(w8, {}, "int8", p, false)[1].instruction, "best: tdpbf16ps tmm");
  // No bandwidth known: compute only.
  const std::vector<OpFloor> nobw = step_floors(w, chosen, "bf16", given_peaks(7000, 200, 14000, 0));
  EXPECT_NEAR(nobw[0].floor_ms, nobw[0].compute_ms, 1e-12);
}

// A model capped below AMX (ALPAMAYO_CPU_ISA=avx512_bf16) is held to the units it may use: the peaks are measured
// for the process, AMX included, but the fastest unit within the cap is the FMA one.
TEST(Roofline, FastestUnitStaysWithinTheModelsCap) {
  const StepWork w = step_work(64, 1536, 16, 8, 128, 6144, 64, {4700 + 64});
  const Peaks p = given_peaks(7000, 200, 14000, 25);
  const uint32_t capped = kAvx2Fma | kAvx512 | kAvx512Vnni | kAvx512Bf16 | kAvxVnni;
  std::string which;
  EXPECT_EQ(p.best_bf16_unit(&which, capped), 200);
  EXPECT_EQ(which, "vfmadd231ps ymm");
  EXPECT_EQ(p.best_bf16_unit(&which), 7000);
  EXPECT_EQ(which, "tdpbf16ps tmm");
  EXPECT_EQ(p.best_int8_unit(nullptr, capped), 0);  // no int8 unit within the cap among these peaks
  const std::vector<OpFloor> f = step_floors(w, {}, "bf16", p, false, capped);
  EXPECT_EQ(f[0].instruction, "best: vfmadd231ps ymm");
  EXPECT_EQ(f[1].instruction, "best: vfmadd231ps ymm");
  EXPECT_STREQ(f[0].bound(), "compute");
  EXPECT_NEAR(f[0].floor_ms, 1e3 * w.matmul_gflop / 200, 1e-9);
  EXPECT_GT(f[0].floor_ms, 5 * step_floors(w, {}, "bf16", p)[0].floor_ms);  // memory-bound on AMX
  // The measured peaks record what each instruction needs, so a model's cap applies to them too.
  for (const PeakEntry& e : measured_peaks(1).entries) EXPECT_NE(e.need, 0u) << e.instruction;
}

TEST(Roofline, TableSaysOfFloorAndTheBound) {
  const StepWork w = step_work(64, 1536, 16, 8, 128, 6144, 64, {4700 + 64});
  std::vector<OpFloor> f = step_floors(w, {{"attention", "avx2_fma", "", 0.0, "vfmadd231ps ymm"}}, "bf16",
                                       given_peaks(7000, 200, 14000, 25));
  f[0].actual_ms = 2 * f[0].floor_ms;
  f[1].actual_ms = 4 * f[1].floor_ms;
  const std::string t = format_floors(f, 2, "  ");
  EXPECT_EQ(t.find("of peak"), std::string::npos) << t;
  EXPECT_NE(t.find("of floor"), std::string::npos) << t;
  EXPECT_NE(t.find(" memory "), std::string::npos) << t;
  EXPECT_NE(t.find(" compute "), std::string::npos) << t;
  EXPECT_NE(t.find(" 50.0%"), std::string::npos) << t;  // the matmuls at twice their floor
  EXPECT_NE(t.find(" 25.0%"), std::string::npos) << t;  // attention at four times
  EXPECT_NE(t.find("25.0 GB/s read bandwidth on 2 threads"), std::string::npos) << t;
  // The total: the sum of the floors against the sum of the times.
  char total[64];
  std::snprintf(total, sizeof total, "%.1f%%",
                100.0 * (f[0].floor_ms + f[1].floor_ms) / (f[0].actual_ms + f[1].actual_ms));
  EXPECT_NE(t.find(std::string(total) + "  (peaks"), std::string::npos) << t;
}

}  // namespace
}  // namespace alpamayo::cpu
