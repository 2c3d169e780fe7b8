// The accuracy check a kernel passes before it may be chosen or forced (docs/CPU_BACKEND.md, "Accuracy check at the
// choice"). At the choice every candidate runs once on the timing shape's own data and its output is compared
// element by element with the portable kernel's (portable_fma for the matmuls, portable for attention) against a
// bound derived from that data and from the roundings a correct kernel may make (kernel_check.cpp): no constant
// fitted to what one machine produces decides. A candidate beyond its bound is left out of the timing (its rejection
// is recorded with the choice, KernelChoice::check); a forced one is an error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/attention/attention.h"

namespace alpamayo::cpu {

// The worst element of one comparison: the largest |d| / bound, with |d| and the bound there.
struct KernelAccuracy {
  double ratio = 0, diff = 0, bound = 0;
  size_t index = 0;
  bool ok() const { return ratio <= 1.0; }
};
// |cand[i] - ref[i]| against bound[i] for i < n. A difference that is not finite, or not 0 against a zero bound, has
// ratio inf.
KernelAccuracy kernel_accuracy(const float* cand, const float* ref, const double* bound, size_t n);
KernelAccuracy kernel_accuracy(const double* cand, const double* ref, const double* bound, size_t n);

// Bound per output of y = x W^T ([M][N]) on |y_candidate - y_portable_fma|, bf16 x [M][K] and w [N][K].
std::vector<double> matmul_bf16_bound(const uint16_t* x, const uint16_t* w, int M, int K, int N);

// int8 weights: x as u8 = q + 128 [M][K] with row scales rs, w as s8 [N][K] with scales ws (quantize_weight_rows);
// the outputs after the step's epilogue ((y - corr) * (ws * rs), copy_rows). How the candidate sums its exact
// integer products decides its own error: fp32 FMA chains (avx512_fma, avx2_fma, portable_fma), one exact int32
// sum rounded once (avx512_vnni, avx2_int8, amx_int8), or oneDNN's int32 sum of u8 x s8 with the +128 correction subtracted
// in fp32 by the epilogue.
enum class Int8Sum { Fp32Chain, Int32, OnednnU8 };
Int8Sum int8_sum_of(const std::string& matmul_kernel);
// The exact integer sums the bound needs: per output S = sum_k q_x q_w and A = sum_k |q_x q_w|, per column
// C = 128 sum_k q_w.
struct Int8Sums {
  int M = 0, K = 0, N = 0;
  std::vector<int64_t> S, A, C;
};
Int8Sums int8_sums(const uint8_t* xq, const int8_t* wq, int M, int K, int N);
std::vector<double> matmul_int8_bound(const Int8Sums& s, const float* rs, const float* ws, Int8Sum cand);

// Attention on one chunk [0, n) of kv for the R query rows of g: the exact (double) softmax output and what the bound
// needs, per row r < R and column c < d.
struct AttnReference {
  int R = 0, d = 0, n = 0;
  bool int8 = false;
  std::vector<double> out;      // [R][d] o = sum_j P_j v_j / L, P_j = 2^(s_j - max s), L = sum_j P_j
  std::vector<double> vbar;     // [R][d] sum_j P_j |v_j| / L
  std::vector<double> p15;      // [R][d] int8: max_j (P_j vs_j) sum_j |v8_j| / L
  std::vector<double> vmax;     // [d] max_j |v_j|
  std::vector<double> sigma;    // [R] max_j c sum_i |q_i k_ji|
  std::vector<double> qround;   // [R] c (max_i |q_i| / 254) max_j sum_i |k_ji|
  std::vector<double> norm;     // [R] sum_j 2^s_j = L 2^(max s)
};
AttnReference attention_reference(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int n);
// Bounds on |O_c / l_c - O_p / l_p| per [R][d] element and on |l_c 2^m_c - l_p 2^m_p| per row, candidate against
// portable.
struct AttnBound {
  std::vector<double> out, norm;
};
AttnBound attention_bound(const AttnReference& ref, AttnKernel cand);

// "checked against portable_fma on 64 x 1536 x 1024, worst |d| / bound: avx512_bf16 0.012, onednn 0.008": the
// ratios of the candidates that passed.
std::string accuracy_summary(const std::string& yardstick, const std::string& shape,
                             const std::vector<std::pair<std::string, double>>& ratios);
// "avx512_bf16 |d| 1.2e-03 > bound 4.5e-04 at output (3, 17) against portable_fma on 64 x 1536 x 1024 (2.7 times
// the bound)".
std::string accuracy_failure(const std::string& kernel, const KernelAccuracy& a, const std::string& where,
                             const std::string& yardstick, const std::string& shape);

// Test-only (tests/cpp/test_cpu_backend_isa.cpp): from now on the check multiplies candidate `kernel`'s output for
// `op` by 1 + relative before comparing it, so that a test can watch an inaccurate kernel be rejected; relative 0
// removes it. Nothing else sets it (no variable, no option). The choices are cached per perturbation
// (kernel_check_perturbations), so a test gets a fresh choice and the unperturbed one stays as it was. Thread-safe.
void set_kernel_check_perturbation_for_testing(const std::string& op, const std::string& kernel, double relative);
double kernel_check_perturbation(const std::string& op, const std::string& kernel);
// The perturbations in force for op, for the choices' cache keys: "" unless a test set one.
std::string kernel_check_perturbations(const std::string& op);

}  // namespace alpamayo::cpu
