// The op suite (docs/TESTING.md, "The op suite"): every kernel a backend has for an op of the contract
// (src/ops/ops.h), on a table of shapes per op, against the reference backend's op. A backend takes part through an
// adapter header (cpu_kernels.h) that lists its kernels from its own kernel lists as OpKernel
// entries; the suite makes the inputs, rounds them as the format says, runs the reference and holds the kernel to
// the op's bounds.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/config.h"
#include "alpamayo/tensor.h"
#include "alpamayo/weights.h"
#include "ops/ops.h"

namespace alpamayo::opsuite {

using ops::Op;

// The sizes of one case; each op reads its own.
struct OpShape {
  std::string name;
  int M = 0, K = 0, N = 0;  // linear: x [M, K], W [N, K]; rms_norm, silu_mul: M rows of n = N
  bool residual = false;    // linear: y = h + x W^T
  // attention: q [T, Hq, d]; the cache segment: S valid rows of P per KV head; a suffix segment of S2 rows;
  // chunks: the key sequence split in that many partials (merged by the kernel's own merge); spike: the last own
  // key aligned with a query (scores far above the running max). qk_norm_rope: x [T, Hq, d].
  int T = 0, Hq = 0, Hkv = 0, d = 0, P = 0, S = 0, S2 = 0, chunks = 1;
  bool spike = false;
  int B = 0;  // action projections: B samples of T tokens
};

// The inputs of one case (fp32; the kernels convert them as they need) and, for the action projections, the
// config and weights.
struct OpData {
  std::vector<float> x, W, h;                                // linear; rms_norm, qk_norm_rope: x; silu_mul: x [M, 2N]
  std::vector<float> q, k_own, v_own, k_cache, v_cache, k_mid, v_mid;  // attention
  std::vector<float> w, cos, sin;                            // norm weights, rope tables [T, d]
  float eps = 1e-6f;
  // action projections: x [B, T, A], t [B]; hidden [B * T, D]; dt.
  std::vector<float> t, hidden;
  float dt = 0.f;
  ExpertConfig cfg;
  std::shared_ptr<std::vector<std::vector<float>>> store;  // the weights' memory (ModelWeights holds views)
  ModelWeights mw;
};

// One kernel of a backend for one op and format.
struct OpKernel {
  std::string backend;  // as registered ("cpu")
  Op op = Op::Linear;
  // linear: the weight format; attention: the KV cache format; rms_norm, silu_mul: the output format ("f32",
  // "bf16", "int8"); the others "f32".
  std::string format;
  std::string kernel;  // the backend's own name for it
  // "" where the kernel runs in this process, else why not (the case is skipped, saying so).
  std::function<std::string()> unavailable;
  // "" for a shape the kernel takes, else why the backend never gives it this one (e.g. K not a multiple of its
  // row alignment); the case is skipped, saying so. Empty: every shape.
  std::function<std::string(const OpShape&)> refuses;
  // The kernel on the case's inputs: the op's output as fp32 (bf16 and int8 outputs dequantised).
  std::function<std::vector<float>(const OpShape&, const OpData&)> run;
  // What the kernel does to its inputs by design beyond the format (int8 queries, an int8 epilogue's scales):
  // applied to the reference's inputs. Empty for nothing.
  std::function<void(const OpShape&, OpData&)> reference_inputs;
  bool print_unrounded = false;  // reference_inputs is a rounding: print the error against the unrounded inputs too
  // The bound on max |out - reference| relative to max |reference| (of each output: action_out_proj_euler's v and
  // x + dt v) the kernel's former test had (attention: per kernel, docs/ACCURACY.md), in place of the op's own
  // bound; 0: the op's own. Not for linear (error model).
  double max_rel = 0;
};

inline OpKernel op_kernel(std::string backend, Op op, std::string format, std::string kernel,
                          std::function<std::string()> unavailable,
                          std::function<std::vector<float>(const OpShape&, const OpData&)> run) {
  OpKernel k;
  k.backend = std::move(backend), k.op = op, k.format = std::move(format), k.kernel = std::move(kernel);
  k.unavailable = std::move(unavailable), k.run = std::move(run);
  return k;
}

// What a backend leaves out of the contract, and why (an op it runs through shared host code, a format it lacks).
struct NotCovered {
  Op op;
  std::string format, why;
};

struct BackendOps {
  std::string backend;
  std::vector<OpKernel> kernels;
  std::vector<NotCovered> not_covered;
};


// The shapes of an op (test_ops.cpp).
std::vector<OpShape> shapes(Op op);

// One test of the suite: a kernel on a shape.
struct OpCase {
  std::shared_ptr<const OpKernel> k;
  OpShape shape;
};
inline void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.k->backend << " " << ops::op_name(c.k->op) << " " << c.k->format << " " << c.k->kernel << " "
      << c.shape.name;
}
inline std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  const OpCase& c = info.param;
  return std::string(ops::op_name(c.k->op)) + "_" + c.k->format + "_" + c.k->kernel + "_" + c.shape.name;
}
// Every kernel of a backend on every shape of its op.
inline std::vector<OpCase> cases(const BackendOps& b) {
  std::vector<OpCase> v;
  for (const OpKernel& k : b.kernels) {
    const auto kp = std::make_shared<const OpKernel>(k);
    for (const OpShape& s : shapes(k.op)) v.push_back({kp, s});
  }
  return v;
}

// The suite (test_ops.cpp: Ops.MatchesTheReference); each backend's instance is
// INSTANTIATE_TEST_SUITE_P(<Backend>, Ops, ::testing::ValuesIn(cases(<adapter>::backend_ops())), case_name).
class Ops : public ::testing::TestWithParam<OpCase> {};

// Every op of the contract and every weight and KV cache format a backend registers has kernels in the suite, or
// the backend says why not (printed).
inline void expect_covers_the_contract(const BackendOps& b) {
  bool registered = false;
  for (const BackendInfo& r : registered_backends()) registered |= r.name == b.backend;
  if (!registered) GTEST_SKIP() << b.backend << " is not built into this library: no formats to check";
  const BackendInfo& info = find_backend(b.backend);
  for (const NotCovered& n : b.not_covered)
    std::printf("  %s %s %s: not in the op suite: %s\n", b.backend.c_str(), ops::op_name(n.op), n.format.c_str(),
                n.why.c_str());
  auto covered = [&](Op op, const std::string& format) {
    for (const OpKernel& k : b.kernels)
      if (k.op == op && (format.empty() || k.format == format)) return true;
    for (const NotCovered& n : b.not_covered)
      if (n.op == op && (format.empty() || n.format == format)) return true;
    return false;
  };
  for (const ops::OpContract& c : ops::kOps) EXPECT_TRUE(covered(c.op, "")) << b.backend << ": " << c.name;
  for (const std::string& f : info.weight_formats) EXPECT_TRUE(covered(Op::Linear, f)) << b.backend << ": linear " << f;
  for (const std::string& f : info.kv_formats) EXPECT_TRUE(covered(Op::Attention, f)) << b.backend << ": kv " << f;
}

// Values exactly representable in bf16, so a kernel reading bf16 sees the reference's operands.
inline std::vector<float> rand_bf16(size_t n, float sd, std::mt19937& rng, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(nd(rng));
  return v;
}

inline std::vector<uint16_t> to_bf16(const float* x, size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(x[i]);
  return v;
}

}  // namespace alpamayo::opsuite
