// The expert's op contract: every op a backend implements, named once, with its inputs, outputs, their layouts and
// the reference backend's function that defines it (docs/MATH.md has the math). The op suite (tests/cpp/ops/) runs
// every kernel each backend has for an op on a table of shapes against that reference; a backend lists its kernels
// there, not here. The reference functions are the oracle only: no production kernel calls them.
//
// Layouts are row-major, innermost last; "bf16-exact" inputs are fp32 values that bf16 holds exactly, so that a
// kernel reading bf16 sees the operands the reference sees.
#pragma once

namespace alpamayo::ops {

enum class Op { RmsNorm, QkNormRope, Attention, Linear, SiluMul, ActionInProj, ActionOutProjEuler };

struct OpContract {
  Op op;
  const char* name;       // as the op suite's test names spell it
  const char* inputs;
  const char* outputs;
  const char* reference;  // the function(s) of the reference backend that define the op
};

inline constexpr OpContract kOps[] = {
    {Op::RmsNorm, "rms_norm", "x [rows, n] fp32; w [n]; eps",
     "y [rows, n] = w * x / sqrt(mean(x^2) + eps), stored as the output format: fp32, bf16 (RNE), or int8 per row "
     "(q + 128 as u8 with scale max|y| / 127)",
     "ref::rms_norm (backends/reference/ops.h)"},
    {Op::QkNormRope, "qk_norm_rope", "x [T, H, d] (query or key heads); w [d]; eps; cos, sin [T, d]",
     "x in place: RMSNorm over each head's d values, then HF rotate_half rotary with row t of the tables",
     "ref::rms_norm, then ref::rope_apply"},
    {Op::Attention, "attention",
     "q [T, Hq, d] (normed, roped); the sample's cache segments in order (k, v [Hkv, rows, d] each: the prompt's "
     "valid rows, then a suffix); own k, v [T, Hkv, d]; KV format bf16 or int8 (every key and value row rounded by "
     "ref::round_rows_s8, kv_int8.h)",
     "out [T, Hq, d]: non-causal GQA softmax(q k^T / sqrt(d)) v over the segments' rows then the own rows, fp32",
     "ref::attention (the KeySegment overload); ref::round_rows_s8 for an int8 cache"},
    {Op::Linear, "linear",
     "x [M, K] fp32 (bf16-exact); W [N, K] fp32 (PyTorch Linear layout) in a weight format: bf16, int8 (x and W "
     "rounded per row, symmetric, by the kernel), bfp8_b, bfp4_b (W rounded as weight_formats.h does), fp8 (e4m3 "
     "per row, where a backend has it); optional residual h [M, N]",
     "y [M, N] = h + x W^T, fp32 accumulation",
     "ref::matmul_nt over the format's weights (apply_weight_format, quantize_linear_transposed; bf16 and int8: "
     "W itself)"},
    {Op::SiluMul, "silu_mul", "g, u: [M, n] each, side by side as one row [M, 2n] (the fused gate_up output)",
     "out [M, n] = silu(g) * u, as fp32 or bf16", "ref::silu"},
    {Op::ActionInProj, "action_in_proj", "x [B, T, A] fp32 (the action); t [B] (the flow time); the weights",
     "emb [B, T, D]: Fourier features, the MLP trunk with its RMSNorms, LayerNorm",
     "ref::ActionInProj (backends/reference/ref_action_proj.h)"},
    {Op::ActionOutProjEuler, "action_out_proj_euler", "hidden [rows, D]; x [rows, A]; dt",
     "v [rows, A] = hidden W^T + b; x' = x + dt * v", "ref::ActionOutProj, then x + dt * v"},
};

inline constexpr const char* op_name(Op op) {
  for (const OpContract& c : kOps)
    if (c.op == op) return c.name;
  return "?";
}

}  // namespace alpamayo::ops
