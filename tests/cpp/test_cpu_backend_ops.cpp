// The cpu backend's parts that are not an op against the reference (those are the op suite's, tests/cpp/ops/): which
// unit oneDNN multiplies on, the int8 cache rows' vectorised quantisation against its definition, the thread pool and
// the matmuls' work stealing.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/kv_int8.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/runtime/isa.h"
#include "backends/cpu/attention/kv_quant.h"
#include "backends/cpu/matmul/onednn_matmul.h"
#include "backends/cpu/runtime/thread_pool.h"

namespace alpamayo::cpu {
namespace {

// oneDNN multiplies on AMX tiles exactly where isa() has them (the OS granted the tile state and
// ALPAMAYO_CPU_ISA allows them) and never elsewhere; the op suite (Cpu/Ops.MatchesTheReference/linear_*_onednn_*) checks the values on
// whichever unit it took. The seed's per-thread gate/up shape.
TEST(Matmul, OnednnUsesAmxExactlyWhereUsable) {
  const IsaInfo& info = isa();  // first: it caps oneDNN (ALPAMAYO_CPU_ISA) before any primitive exists
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  OnednnPrimitives kernels(eng);
  ScopedOmpThreads one(1);
  const std::tuple<WeightType, uint32_t, const char*> cases[] = {{WeightType::BF16, kAmxBf16, "amx_bf16"},
                                                                   {WeightType::INT8, kAmxInt8, "amx_int8"}};
  for (const auto& [wt, flag, name] : cases) {
    std::string impl;
    try {
      impl = kernels.get(wt, 64, 1536, 1024, 1024)->pd.impl_info_str();
    } catch (const alpamayo::Error& e) {  // e.g. no bf16 matmul in oneDNN under ALPAMAYO_CPU_ISA=avx2
      EXPECT_FALSE(info.has(flag)) << e.what();
      std::printf("  [skipped] %s on oneDNN: %s\n", name, e.what());
      continue;
    }
    if (info.has(flag)) {
      EXPECT_NE(impl.find("amx"), std::string::npos) << name << " is usable, oneDNN chose " << impl;
      std::printf("  %s usable here: oneDNN runs %s\n", name, impl.c_str());
    } else {
      EXPECT_EQ(impl.find("amx"), std::string::npos) << name << " is not usable, oneDNN chose " << impl;
      std::printf("  [skipped] %s on oneDNN: not usable here (isa: %s); oneDNN runs %s\n", name,
                  info.describe().c_str(), impl.c_str());
    }
  }
}

// The int8 cache's vectorised quantisation gives quantize_row_s8's bits (kv_int8.h), bf16 and fp32 rows, with the
// key bias, on rows of any length, with ties, zeros and non-finite values.
TEST(CpuOps, Int8CacheRowsMatchTheDefinition) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d : {1, 2, 7, 8, 34, 128, 130}) {
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> x(d);
      for (float& v : x) v = bf16_round(nd(rng) * 3.f);
      if (kind == 1) std::fill(x.begin(), x.end(), 0.f);
      if (kind == 2) {  // ties: a = 127 / 2^k makes x * (127 / a) land on halves
        for (int c = 0; c < d; ++c) x[c] = float(c % 255 - 127) * 0.5f;
        x[0] = 127.f;
      }
      if (kind == 3) x[d / 2] = NAN;
      if (kind == 4) x[d - 1] = -INFINITY;
      std::vector<uint16_t> xb(d);
      for (int c = 0; c < d; ++c) xb[c] = f32_to_bf16(x[c]);
      std::vector<int8_t> want(d), got(d), got_b(d);
      const float s = quantize_row_s8(x.data(), d, want.data());
      for (int bias : {0, 128}) {
        const float sf = quantize_row_avx2(x.data(), false, d, bias, got.data());
        const float sb = quantize_row_avx2(xb.data(), true, d, bias, got_b.data());
        for (float sx : {sf, sb}) {
          if (std::isnan(s)) EXPECT_TRUE(std::isnan(sx)) << "d " << d << " kind " << kind;
          else EXPECT_EQ(sx, s) << "d " << d << " kind " << kind;
        }
        for (int c = 0; c < d; ++c) {
          const int8_t w = static_cast<int8_t>(static_cast<uint8_t>(int(want[c]) + bias));
          ASSERT_EQ(got[c], w) << "fp32 d " << d << " kind " << kind << " c " << c << " bias " << bias;
          ASSERT_EQ(got_b[c], w) << "bf16 d " << d << " kind " << kind << " c " << c << " bias " << bias;
        }
      }
    }
  }
}

TEST(CpuOps, ThreadPoolBarrierAndErrors) {
  ThreadPool pool(3);
  std::atomic<int> phase1{0};
  std::vector<int> seen(3, -1);
  pool.run([&](int t) {
    phase1.fetch_add(1);
    pool.barrier();
    seen[t] = phase1.load();
    pool.barrier();
  });
  EXPECT_EQ(seen, std::vector<int>(3, 3));
  EXPECT_THROW(pool.run([&](int t) {
                 if (t == 2) throw std::runtime_error("x");
               }),
               std::runtime_error);
  int ran = 0;
  pool.run([&](int t) { if (t == 0) ++ran; });
  EXPECT_EQ(ran, 1);
}

// The matmuls' work stealing: owners take from the front, the others from the back, every item exactly once.
TEST(CpuOps, StealQueueHandsOutEveryItemOnce) {
  StealQueue q;
  q.reset(3, 7);
  EXPECT_EQ(q.take_front(), 3);
  EXPECT_EQ(q.take_back(), 6);
  EXPECT_EQ(q.take_front(), 4);
  EXPECT_EQ(q.take_back(), 5);
  EXPECT_EQ(q.take_front(), -1);
  EXPECT_EQ(q.take_back(), -1);
  q.reset(2, 2);
  EXPECT_EQ(q.take_back(), -1);

  // Four threads, each owning a queue, then taking from the others' backs: each item claimed once.
  constexpr int kThreads = 4, kItems = 5000;
  ThreadPool pool(kThreads);
  std::vector<StealQueue> queues(kThreads);
  for (int round = 0; round < 20; ++round) {
    // Uneven queues, one empty, so that stealing happens.
    const int bounds[kThreads + 1] = {0, kItems / 10, kItems / 10, kItems / 2, kItems};
    for (int t = 0; t < kThreads; ++t) queues[t].reset(bounds[t], bounds[t + 1]);
    std::vector<std::atomic<int>> claimed(kItems);
    pool.run([&](int t) {
      for (int i; (i = queues[t].take_front()) >= 0;) claimed[i].fetch_add(1);
      for (int v = 1; v < kThreads; ++v)
        for (int i; (i = queues[(t + v) % kThreads].take_back()) >= 0;) claimed[i].fetch_add(1);
    });
    for (int i = 0; i < kItems; ++i) ASSERT_EQ(claimed[i].load(), 1) << "item " << i << ", round " << round;
  }
}

}  // namespace
}  // namespace alpamayo::cpu
