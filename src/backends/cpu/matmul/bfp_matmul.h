// Weight matrices in Tenstorrent's block formats (bfp8_b, bfp4_b) held in memory as the device holds them, and
// the matmul kernels that dequantise them on the fly: y[M, n] = x[M, K] (bf16) * W^T[K, n], fp32 accumulation.
//
// Storage: one column slice [n0, n0 + n) of W^T (W [N, K] in PyTorch layout, n0 a multiple of 32, so the blocks
// and tiles are those of the whole matrix) as 32x32 tiles of tt-metal's bytes (docs/BFP.md), ordered panel by
// panel (kPanel = 64 output columns), tile rows top to bottom within a panel, so a kernel reads its weights
// strictly sequentially. Matrices kept in bf16 use the same panels as bf16 pairs (below), read in place.
//
// Kernel: per panel and per block of kKBlock rows of K, the tiles are decoded into a small bf16 buffer (L1) in
// the pair layout [k/2][64 columns][2] and multiplied with every row of x (AVX512-BF16 `vdpbf16ps`, register tile
// of up to 6 rows x 64 columns). bfp8_b / bfp4_b values have at most 8 significant bits, so the bf16 copy is
// exact: the products are those of the dequantised weights. Without AVX512-BF16 a portable kernel (plain C++,
// fp32) runs instead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "alpamayo/bfp.h"
#include "backends/cpu/runtime/huge_buf.h"

namespace alpamayo::cpu {

enum class BlockStore : uint8_t { BF16, BFP8_B, BFP4_B };

inline constexpr int kPanel = 64;    // output columns per panel
inline constexpr int kKBlock = 256;  // rows of K decoded at once (a multiple of 32)

class BlockWeights {
 public:
  // Packs rows [0, n) of W (pointing at row n0 of the full [N, K] matrix, n0 % 32 == 0), i.e. columns
  // [n0, n0 + n) of W^T. bf16 storage rounds to nearest even.
  void pack(BlockStore s, const float* W, int K, int n);
  // The values the kernels multiply with, [n, K] row-major (the layout of W): for the tests.
  std::vector<float> dequantize() const;

  BlockStore store() const { return store_; }
  int K() const { return K_; }
  int N() const { return N_; }
  const uint8_t* data() const { return buf_ ? static_cast<const uint8_t*>(buf_->data()) : nullptr; }
  size_t bytes() const { return bytes_; }
  // Byte offset of panel p (64 output columns; within it tile rows, or bf16 pair rows, follow each other).
  size_t panel_offset(int p) const;
  int tile_rows() const { return (K_ + 31) / 32; }

 private:
  BlockStore store_ = BlockStore::BF16;
  int K_ = 0, N_ = 0;
  size_t bytes_ = 0;
  std::shared_ptr<const HugeBuf> buf_;
};

// One thread's column slice of a linear layer: parts written to consecutive output columns (the fused MLP
// slice: gate columns, then up columns; every other layer: one part).
struct BlockLinear {
  std::vector<BlockWeights> parts;
  int N() const;
  size_t bytes() const;
};

enum class BlockKernel { Avx512Bf16, Portable };
bool block_kernel_avx512_available();
// The kernel to use by default on this machine.
inline BlockKernel default_block_kernel() {
  return block_kernel_avx512_available() ? BlockKernel::Avx512Bf16 : BlockKernel::Portable;
}
// Scratch bytes one thread needs for block_matmul.
size_t block_scratch_bytes();

// y[m][c] = sum_k x[m][k] w[c][k] for m < M, c < lin.N(): x bf16 [M, ldx], y fp32 [M, ldy]; scratch: 64-byte
// aligned, block_scratch_bytes().
void block_matmul(BlockKernel kernel, const BlockLinear& lin, const uint16_t* x, int M, int ldx, float* y, int ldy,
                  void* scratch);
void block_matmul(BlockKernel kernel, const BlockWeights& w, const uint16_t* x, int M, int ldx, float* y, int ldy,
                  void* scratch);

// Internal: the AVX512-BF16 kernel of one part (bfp_matmul_avx512.cpp, an ISA file: it gets the part as plain
// values, so that it calls no inline member function of BlockWeights; docs/CPU_BACKEND.md, the COMDAT rule).
struct BlockPart {
  const uint8_t* data;
  BlockStore store;
  int K, N, tile_rows;
  size_t panel_bytes;  // panel p starts at data + p * panel_bytes
};
void block_matmul_avx512(const BlockPart& w, const uint16_t* x, int M, int ldx, float* y, int ldy, void* scratch);

}  // namespace alpamayo::cpu
