// The weight formats of the host backends as values: which matrices a block format (bfp8_b, bfp4_b) holds and
// which stay bf16, and the exact values a matmul multiplies with under that format. The reference backend (its
// fp32 oracle) and the cpu backend (its block kernels) both take their quantised values from here, so their
// weights are the same bits.
//
// Layout of the block formats, as a device port stores the weights (ttnn TILE layout of `W.T`, [K, N]): a block
// is 16 consecutive output features at one input index, aligned to multiples of 16 of the output index. q, k, v
// are one matrix (`cat(q, k, v).T`, the seed's wqkv), o, gate, up and down one each.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/backend.h"
#include "alpamayo/bfp.h"

namespace alpamayo {

enum class LinearKind : int { QKV, O, Gate, Up, Down };
inline constexpr int kLinearKinds = 5;
const char* linear_kind_name(LinearKind k);  // "qkv", "o", "gate", "up", "down"

struct WeightFormat {
  std::string name;                    // the format, as BackendOptions::weights names it
  std::optional<bfp::Format> block;    // bfp8_b / bfp4_b; none for f32, bf16, int8
  std::array<bool, kLinearKinds> bf16{};  // block formats: this matrix kept in bf16 instead
  // The block format matrix k is stored in, if any.
  std::optional<bfp::Format> block_of(LinearKind k) const {
    return block && !bf16[static_cast<int>(k)] ? block : std::nullopt;
  }
  bool is_block() const { return block.has_value(); }
};

// Reads opts.weights (a format the backend offers) and opts.bf16_weights; throws Error for an unknown matrix
// name, or for bf16_weights given with a format that is not a block format.
WeightFormat parse_weight_format(const BackendOptions& opts);

// W [N, K] row-major fp32 (PyTorch Linear layout), in place: each block of 16 consecutive rows (output features,
// from row 0) at one column is quantised to bfp and dequantised, bit for bit as bfp::quantize_matrix on W.T.
void quantize_linear_transposed(bfp::Format f, float* W, int64_t N, int64_t K);

// In place: the values the backends multiply with for matrix k under format wf. Block formats: block quantisation
// (above) or, for matrices kept in bf16, rounding to bf16 (RNE); other formats: unchanged (fp32).
void apply_weight_format(const WeightFormat& wf, LinearKind k, float* W, int64_t N, int64_t K);

}  // namespace alpamayo
