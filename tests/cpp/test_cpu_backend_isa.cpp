// The cpu backend's run-time kernel choice: ISA detection and its cap (ALPAMAYO_CPU_ISA), forced kernels
// (ALPAMAYO_CPU_KERNELS), the attention kernel's selection, and the instruction peaks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cpu/attention.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/peaks.h"
#include "test_util.h"

namespace alpamayo::cpu {
namespace {

// ctest's conformance_avx2 reruns part of this suite with ALPAMAYO_CPU_ISA=avx2 and ALPAMAYO_TEST_ONLY_IF_CAPPED=1
// (CMakeLists.txt). Where that cap takes away nothing this CPU has (no AVX-512, no AVX-VNNI), the rerun would
// repeat the main suite test for test: every test is then skipped, and the reason printed.
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

TEST(Isa, ForcedKernelParsing) {
  test::ScopedEnv env("ALPAMAYO_CPU_KERNELS", "");
  EXPECT_EQ(forced_kernel("attention"), "");
  env.set("attention=avx2_fma,matmul_bf16=onednn");
  EXPECT_EQ(forced_kernel("attention"), "avx2_fma");
  EXPECT_EQ(forced_kernel("matmul_bf16"), "onednn");
  EXPECT_EQ(forced_kernel("matmul_int8"), "");
  EXPECT_EQ(forced_kernel("attention_kv_int8"), "");  // select_attention_kernel falls back to "attention"
  env.set("attention_kv_int8=avx512_vnni");
  EXPECT_EQ(forced_kernel("attention_kv_int8"), "avx512_vnni");
  EXPECT_EQ(forced_kernel("attention"), "");
  test::expect_error([] { forced_kernel("conv"); }, {"no kernel choice for op \"conv\"", "attention, attention_kv_int8, matmul_bf16"});
  env.set("attention");
  test::expect_error([] { forced_kernel("attention"); },
                     {"ALPAMAYO_CPU_KERNELS=\"attention\"", "is not op=kernel",
                      "attention, attention_kv_int8, matmul_bf16, matmul_int8"});
  env.set("attention=");
  test::expect_error([] { forced_kernel("attention"); }, {"\"attention=\" is not op=kernel"});
  env.set("attention=avx2_fma,matmul_bf16=onednn,attention=portable");
  test::expect_error([] { forced_kernel("matmul_int8"); }, {"op \"attention\" given twice"});
  env.set("attn=avx2_fma");
  test::expect_error([] { forced_kernel("matmul_bf16"); }, {"unknown op \"attn\"", "attention, attention_kv_int8, matmul_bf16"});
}

TEST(Isa, KernelChoicesReplacePerOp) {
  const auto before = kernel_choices();
  record_kernel_choice({"test_op", "a", "first", 1.0, ""});
  record_kernel_choice({"test_op", "b", "second", 2.0, "vfmadd231ps ymm"});
  int n = 0;
  for (const KernelChoice& c : kernel_choices())
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
  test::ScopedEnv env("ALPAMAYO_CPU_KERNELS", "attention=avx2_fma");
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, true), AttnKernel::Avx2Fma);
  env.set("attention=avx2_fma,attention_kv_int8=portable");
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, false), AttnKernel::Avx2Fma);
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512, true), AttnKernel::Portable);
  record_kernel_choice({"test_op", "a", "first", 1.0, ""});
  const std::string pin = kernel_pin();
  EXPECT_EQ(pin.find("attention=avx2_fma,attention_kv_int8=portable"), 0u) << pin;
  EXPECT_EQ(pin.find("test_op"), std::string::npos) << pin;
  env.set(pin);
  int pinned = 0;
  for (const KernelChoice& c : kernel_choices())
    if (c.op != "test_op") {
      EXPECT_EQ(forced_kernel(c.op), c.kernel) << c.op << " in " << pin;
      ++pinned;
    }
  EXPECT_GE(pinned, 2);
}

TEST(AttentionSelection, NamesAndAvailability) {
  EXPECT_TRUE(attn_kernel_unavailable(AttnKernel::Portable).empty());
  for (AttnKernel k : kAttnKernels)
    if (attn_kernel_unavailable(k).empty()) { EXPECT_EQ(attn_kernel_from_name(attn_kernel_name(k), "test"), k); }
}

TEST(AttentionSelection, UnknownOrUnrunnableNamesAreErrors) {
  test::expect_error([] { attn_kernel_from_name("amx", "ALPAMAYO_CPU_KERNELS"); },
                     {"ALPAMAYO_CPU_KERNELS", "unknown attention kernel \"amx\"",
                      "avx512_bf16, avx512_vnni, avx512_fma, avx2_fma, portable", "runnable here"});
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

TEST(AttentionSelection, FastestRunnableOrForced) {
  test::ScopedEnv env("ALPAMAYO_CPU_KERNELS", "");
  const AttnKernel k = select_attention_kernel(64, 2, 8, 512);
  EXPECT_TRUE(attn_kernel_unavailable(k).empty());
  if (isa().has(kAvx2Fma)) { EXPECT_NE(k, AttnKernel::Portable) << "a vectorised kernel runs on every AVX2 CPU"; }
  bool found = false;
  for (const KernelChoice& c : kernel_choices())
    if (c.op == "attention") {
      found = true;
      EXPECT_EQ(c.kernel, attn_kernel_name(k));
      EXPECT_EQ(c.instruction, attn_kernel_instruction(k));
      if (k != AttnKernel::Portable) { EXPECT_GT(c.gflops, 0.0); }
      std::printf("attention: %s (%s)\n", c.kernel.c_str(), c.why.c_str());
    }
  EXPECT_TRUE(found);
  // Cached: the same shape again picks the same kernel without timing.
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512), k);
  env.set("attention=portable");
  EXPECT_EQ(select_attention_kernel(64, 2, 8, 512), AttnKernel::Portable);
  env.set("attention=fastest");
  test::expect_error([] { select_attention_kernel(64, 2, 8, 512); },
                     {"ALPAMAYO_CPU_KERNELS", "unknown attention kernel \"fastest\"", "avx2_fma"});
}

TEST(Peaks, MeasuredWhereRunnable) {
  const Peaks& p = measured_peaks(1);
  EXPECT_EQ(&p, &measured_peaks(1));  // cached
  ASSERT_EQ(p.entries.size(), 7u);
  for (const PeakEntry& e : p.entries) {
    std::printf("  %-16s %8.1f %s %s\n", e.instruction.c_str(), e.rate, e.unit.c_str(), e.why_not.c_str());
    if (e.why_not.empty())
      EXPECT_GT(e.rate, 1.0) << e.instruction;  // any CPU of the last decade does > 1 GFLOP/s per core
    else
      EXPECT_EQ(e.rate, 0.0) << e.instruction;
  }
  EXPECT_EQ(p.of("vfmadd231ps ymm") > 0, isa().has(kAvx2Fma));
  EXPECT_EQ(p.of("vdpbf16ps zmm") > 0, isa().has(kAvx512 | kAvx512Bf16));
  EXPECT_GE(p.best_bf16_unit(), p.of("vfmadd231ps ymm"));
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
  // the 309 GFLOP of weight matmuls and 158 GFLOP of attention.
  const StepWork w = step_work(64, 1536, 16, 8, 128, 6144, 64, {4700 + 64});
  EXPECT_NEAR(w.matmul_gflop, 309, 2);
  EXPECT_NEAR(w.attention_gflop, 160, 3);
  const auto f = step_floors(w, "bf16", 1);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].op, "matmul_bf16");
  EXPECT_EQ(f[1].op, "attention");
  for (const OpFloor& o : f)
    if (o.peak > 0) { EXPECT_NEAR(o.floor_ms, 1e3 * o.gflop / o.peak, 1e-9); }
  const std::string table = format_floors(f, 1, "  ");
  EXPECT_NE(table.find("matmul_bf16"), std::string::npos) << table;
  EXPECT_NE(table.find("floor"), std::string::npos) << table;
}

}  // namespace
}  // namespace alpamayo::cpu
