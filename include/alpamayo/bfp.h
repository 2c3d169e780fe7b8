// Tenstorrent block floating-point formats bfp8_b and bfp4_b, bit-exact with tt-metal's host-side
// conversion (tt_metal/impl/data_format/blockfloat_common.cpp: get_max_exp, convert_u32_to_bfp,
// pack_as_bfp_tiles; bfloat8.cpp / bfloat4.cpp: unpack_bfp{8,4}_tiles_into_float_vec). docs/BFP.md has
// the rules, the byte layout and the citations.
//
// A block is 16 values that share one 8-bit exponent: the largest fp32 exponent field among them. Each value
// keeps a sign bit and a magnitude of 7 (bfp8_b) or 3 (bfp4_b) bits whose top bit has weight 2^0 at the
// shared exponent: value = (-1)^s * m * 2^(E - 127 - (W - 1)), W = magnitude bits. Blocks are the rows of
// the 16x16 faces of a 32x32 tile; a tile stores its 64 exponents first, then its 64 blocks of mantissas.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace alpamayo::bfp {

enum class Format : uint8_t { Bfp8_b, Bfp4_b };

inline constexpr int kTileDim = 32;         // a tile is 32 x 32 values
inline constexpr int kFaceDim = 16;         // in four 16 x 16 faces: top-left, top-right, bottom-left, bottom-right
inline constexpr int kBlockSize = 16;       // one face row: 16 values, one shared exponent
inline constexpr int kBlocksPerTile = 64;   // 4 faces x 16 rows; also the exponent bytes per tile

// Magnitude bits per value (the sign is one more bit): 7 or 3.
constexpr int mantissa_bits(Format f) { return f == Format::Bfp8_b ? 7 : 3; }
// Mantissa bytes of one block: 16 (bfp8_b, one byte per value) or 8 (bfp4_b, two values per byte).
constexpr size_t block_bytes(Format f) { return f == Format::Bfp8_b ? 16 : 8; }
// Bytes of one 32x32 tile: 64 exponents + 64 blocks = 1088 (bfp8_b) or 576 (bfp4_b). 64 exponent bytes are
// already a multiple of the 16-byte L1 alignment, so a 32x32 tile has no exponent padding.
constexpr size_t tile_bytes(Format f) { return kBlocksPerTile + kBlocksPerTile * block_bytes(f); }

const char* format_name(Format f);                       // "bfp8_b", "bfp4_b"
bool parse_format(const std::string& s, Format* out);    // accepts the names above

// ---- Scalars -------------------------------------------------------------------------------------------
// The fp32 exponent field (0..255) shared by a block: the maximum over its values, Inf/NaN included
// (get_max_exp with is_exp_a = false).
uint8_t shared_exponent(const float* v, int n = kBlockSize);
// The sign-magnitude code of x in a block with exponent shared_exp >= x's exponent field
// (convert_u32_to_bfp<Bfp*_b, false>): exponent-field-0 inputs (zeros, denormals) -> 0; the significand with
// its hidden bit is shifted right by the exponent difference, rounded to nearest with ties to even and
// saturated at 2^W - 1 (a carry never reaches the exponent); a zero magnitude never carries a sign.
uint8_t encode(float x, uint8_t shared_exp, Format f);
// The fp32 value of a code, as unpack_bfp{8,4}_tiles_into_float_vec builds it bit by bit (see docs/BFP.md:
// for codes that pack() cannot produce below FLT_MIN this is tt-metal's flush or denormal quirk, not m*2^k).
float decode(uint8_t code, uint8_t shared_exp, Format f);

// ---- Blocks (16 values) --------------------------------------------------------------------------------
// Encodes 16 values: writes block_bytes(f) mantissa bytes, returns the shared exponent.
uint8_t encode_block(Format f, const float* v, uint8_t* mant);
uint8_t encode_block_bf16(Format f, const uint16_t* v, uint8_t* mant);
// Decodes one block's 16 values.
void decode_block(Format f, uint8_t shared_exp, const uint8_t* mant, float* out);
// out[0..n) = decode(encode(in[0..n))) for n <= 16 values of one block (missing values count as zeros, which
// never change a block's exponent); in == out is allowed.
void quantize_block(Format f, const float* in, float* out, int n = kBlockSize);

// ---- Tiles: tt-metal's pack_as_bfp_tiles / unpack_bfp*_tiles_into_float_vec (32x32 tiles, is_exp_a = false)
// src holds n_tiles * 1024 floats, tile after tile. row_major_input = true: each tile's values row-major
// (32 rows of 32); false: already in face order (face 0's 16 rows of 16, then faces 1, 2, 3), i.e. tt-metal's
// TILED_NFACES layout, which is what ttnn hands to pack_as_bfp8_tiles after tilizing a tensor.
// dst receives n_tiles * tile_bytes(f) bytes: the uint32 words tt-metal returns, in little-endian order.
void pack_tiles(Format f, const float* src, size_t n_tiles, bool row_major_input, uint8_t* dst);
std::vector<uint8_t> pack_tiles(Format f, const std::vector<float>& src, bool row_major_input);  // size % 1024 == 0
void unpack_tiles(Format f, const uint8_t* src, size_t n_tiles, bool row_major_output, float* dst);

// Where block p (0..63) of a tile sits in the tile: rows / columns of its 16 values.
inline int block_row(int p) { return (p / 32) * kFaceDim + p % kFaceDim; }
inline int block_col(int p) { return ((p / 16) % 2) * kFaceDim; }
// The block holding tile element (row, col), 0 <= row, col < 32; col % 16 is its position in the block.
inline int block_index(int row, int col) { return ((row / 16) * 2 + col / 16) * 16 + row % 16; }
inline uint8_t tile_exponent(const uint8_t* tile, int p) { return tile[p]; }
inline const uint8_t* tile_mantissas(Format f, const uint8_t* tile, int p) {
  return tile + kBlocksPerTile + static_cast<size_t>(p) * block_bytes(f);
}
// Decodes a whole tile into a row-major 32x32 window of dst with leading dimension ld (floats).
void dequantize_tile(Format f, const uint8_t* tile, float* dst, size_t ld);

// ---- Matrices ------------------------------------------------------------------------------------------
// A row-major [rows, cols] matrix as ttnn stores it in TILE layout: tiles in row-major tile order
// (tile (tr, tc) at index tr * tile_cols() + tc), each tile packed as pack_tiles does. Any rows / cols work:
// the matrix is padded with zeros up to multiples of 32, as ttnn pads a tensor before tilizing; zeros never
// raise a block's exponent, so padding changes no real value.
struct PackedMatrix {
  Format format = Format::Bfp8_b;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;

  int64_t tile_rows() const { return (rows + kTileDim - 1) / kTileDim; }
  int64_t tile_cols() const { return (cols + kTileDim - 1) / kTileDim; }
  const uint8_t* tile(int64_t tr, int64_t tc) const {
    return bytes.data() + static_cast<size_t>(tr * tile_cols() + tc) * tile_bytes(format);
  }
  // The block holding elements (r, c0 .. c0 + 15) for c0 % 16 == 0: its exponent and mantissas.
  uint8_t block_exponent(int64_t r, int64_t c0) const {
    return tile(r / kTileDim, c0 / kTileDim)[block_index(int(r % kTileDim), int(c0 % kTileDim))];
  }
  const uint8_t* block_mantissas(int64_t r, int64_t c0) const {
    return tile_mantissas(format, tile(r / kTileDim, c0 / kTileDim), block_index(int(r % kTileDim), int(c0 % kTileDim)));
  }
  // Decodes matrix row r (cols values), e.g. one K-row of a [K, N] weight for an axpy-style matmul.
  void dequantize_row(int64_t r, float* out) const;
  // Decodes the whole matrix, row-major [rows, cols].
  void unpack(float* out) const;
  std::vector<float> unpack() const;
};

PackedMatrix pack_matrix(Format f, const float* src, int64_t rows, int64_t cols);
PackedMatrix pack_matrix_bf16(Format f, const uint16_t* src, int64_t rows, int64_t cols);

// Quantises and dequantises a row-major [rows, cols] matrix in place: bit for bit pack_matrix(...).unpack(),
// without the tiles (each aligned run of 16 columns of a row is one block). This is the CPU oracle's view of
// a weight stored in bfp8_b / bfp4_b on the device.
void quantize_matrix(Format f, float* m, int64_t rows, int64_t cols);

}  // namespace alpamayo::bfp
