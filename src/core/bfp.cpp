// bfp8_b / bfp4_b conversion, written from the rules of tt-metal's host code (see include/alpamayo/bfp.h and
// docs/BFP.md). The per-block loops are branch-free over 16 lanes so the compiler vectorises them.
#include "alpamayo/bfp.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "alpamayo/error.h"

#if defined(__GNUC__) && !defined(__clang__)
// Block vectors are passed between inlined internal functions only, so the AVX-512 ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace alpamayo::bfp {
namespace {

// ---- Encoding ------------------------------------------------------------------------------------------
// W magnitude bits. tt-metal, blockfloat_common.cpp, convert_u32_to_bfp (B formats, no truncation):
//  * exponent field 0 (+-0 and every denormal): code 0;
//  * significand = 1.fraction as a 24-bit integer, shifted right by (shared - own exponent); shifts of 32
//    or more give 0 (tt-metal splits them into shifts of at most 31);
//  * keep the top W of the 24 bits; the 24 - W dropped bits round to nearest, ties to the even kept value;
//  * the rounded magnitude saturates at 2^W - 1 (1.99609375 -> 127/64 in bfp8_b, not 2.0);
//  * the sign bit (bit W) is set only when the magnitude is not 0.
// The 16 lanes of a block are one GCC/Clang vector: the compiler maps it onto the widest vector unit there is
// (one AVX-512 register, two AVX2 ones, ...), which plain loops over 16 lanes did not get.
using u32x16 = uint32_t __attribute__((vector_size(64)));
using u8x16 = uint8_t __attribute__((vector_size(16)));
using u8x8 = uint8_t __attribute__((vector_size(8)));
using u16x16 = uint16_t __attribute__((vector_size(32)));
using u32x8 = uint32_t __attribute__((vector_size(32)));
static_assert(std::endian::native == std::endian::little, "bfp: the tile byte stream is tt-metal's little-endian words");

inline u32x16 splat(uint32_t x) { return u32x16{} + x; }
// Comparisons of vectors give lanes of all ones or zeros; as_mask reinterprets them as unsigned lanes.
template <typename M>
inline u32x16 as_mask(const M& m) { return reinterpret_cast<const u32x16&>(m); }

template <int W>
inline u32x16 encode_lanes(const u32x16& u, uint32_t shared) {
  constexpr uint32_t kDrop = 24 - W, kHalf = 1u << (kDrop - 1), kRest = (1u << kDrop) - 1, kMax = (1u << W) - 1;
  const u32x16 e = (u >> 23) & 0xffu;
  u32x16 shift = splat(shared) - e;
  shift = shift > 31u ? splat(31) : shift;
  const u32x16 sig = ((u & 0x7fffffu) | 0x800000u) >> shift;
  u32x16 keep = sig >> kDrop;
  const u32x16 rest = sig & kRest;
  keep += (as_mask(rest > kHalf) | (as_mask(rest == kHalf) & keep)) & 1u;
  keep = keep > kMax ? splat(kMax) : keep;
  keep &= ~as_mask(e == 0u);
  return (keep | ((u >> 31) << W)) & ~as_mask(keep == 0u);
}

inline uint32_t max_exponent(const u32x16& u) {
  const u32x16 e = (u >> 23) & 0xffu;
  uint32_t m = 0;
  for (int j = 0; j < kBlockSize; ++j) m = std::max(m, e[j]);
  return m;
}

// Codes to mantissa bytes: bfp8_b one per byte; bfp4_b value 2k in the low nibble of byte k, 2k+1 in the high
// nibble (tt-metal fills each uint32 from its least significant bits: value i of a word at bit 4i).
template <Format F>
inline uint8_t encode_bits(const u32x16& u, uint8_t* mant) {
  const uint32_t shared = max_exponent(u);
  const u32x16 code = encode_lanes<mantissa_bits(F)>(u, shared);
  if constexpr (F == Format::Bfp8_b) {
    const u8x16 bytes = __builtin_convertvector(code, u8x16);
    std::memcpy(mant, &bytes, kBlockSize);
  } else {
    // Lanes 2k and 2k+1 as the low and high halves of one 32-bit lane (little-endian), then one nibble each.
    const u32x8 pairs = reinterpret_cast<u32x8>(__builtin_convertvector(code, u16x16));
    const u8x8 bytes = __builtin_convertvector((pairs & 0xfu) | ((pairs >> 12) & 0xf0u), u8x8);
    std::memcpy(mant, &bytes, kBlockSize / 2);
  }
  return static_cast<uint8_t>(shared);
}

template <Format F>
inline uint8_t encode_f32(const float* v, uint8_t* mant) {
  u32x16 u;
  std::memcpy(&u, v, sizeof u);
  return encode_bits<F>(u, mant);
}

template <Format F>
inline uint8_t encode_bf16(const uint16_t* v, uint8_t* mant) {
  u16x16 h;
  std::memcpy(&h, v, sizeof h);
  return encode_bits<F>(__builtin_convertvector(h, u32x16) << 16, mant);
}

// ---- Decoding ------------------------------------------------------------------------------------------
// tt-metal, bfloat8.cpp / bfloat4.cpp, unpack_bfp{8,4}_tiles_into_float_vec, per lane with magnitude m,
// sign s and shared exponent E:
//  * m == 0: the bits s << 31 (a stored 0x80 reads as -0.0);
//  * else shift m left until its bit W-1 is set (n shifts), drop that leading one, exponent E - n;
//    n > E: +0.0 (the whole lane is zeroed, sign included); E - n == 0 leaves an exponent field of 0, so the
//    remaining fraction reads as a denormal without the leading one.
// This bit-level form is the reference; decode_lanes takes a float-multiply shortcut where it is equal.
template <int W>
inline uint32_t decode_exact(uint32_t code, uint32_t shared) {
  constexpr uint32_t kMax = (1u << W) - 1;
  const uint32_t m = code & kMax, s = (code >> W) & 1u;
  if (m == 0) return s << 31;
  const uint32_t n = static_cast<uint32_t>(W - std::bit_width(m));  // left shifts to bring the top bit to W-1
  if (n > shared) return 0;
  const uint32_t frac = (m << (n + 1)) & kMax;
  return (s << 31) | ((shared - n) << 23) | (frac << (23 - W));
}

// For W <= shared <= 254 every nonzero code decodes to the normal float m * 2^(shared - 127 - (W-1)), which a
// float multiply by that power of two gives exactly (m < 2^W is exact, no overflow or underflow).
template <int W>
inline void decode_lanes(const uint8_t* code, uint32_t shared, float* out) {
  constexpr uint32_t kMax = (1u << W) - 1;
  if (shared >= static_cast<uint32_t>(W) && shared <= 254) {
    const float scale = std::bit_cast<float>((shared - (W - 1)) << 23);
    alignas(64) uint32_t bits[kBlockSize];
    for (int j = 0; j < kBlockSize; ++j) {
      const uint32_t c = code[j];
      const float v = static_cast<float>(static_cast<int32_t>(c & kMax)) * scale;
      bits[j] = std::bit_cast<uint32_t>(v) | ((c >> W) << 31);
    }
    std::memcpy(out, bits, sizeof bits);
  } else {
    for (int j = 0; j < kBlockSize; ++j) out[j] = std::bit_cast<float>(decode_exact<W>(code[j], shared));
  }
}

// bfp4_b has only 16 codes: decode all of them once for the block (one vector pass), then look the 16
// nibbles up; this beats unpacking nibbles into lanes, which compilers vectorise poorly.
inline constexpr uint8_t kAllNibbles[kBlockSize] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

template <Format F>
inline void decode_f32(uint8_t shared, const uint8_t* mant, float* out) {
  if constexpr (F == Format::Bfp8_b) {
    decode_lanes<7>(mant, shared, out);
  } else {
    alignas(64) float table[kBlockSize];
    decode_lanes<3>(kAllNibbles, shared, table);
    for (int k = 0; k < kBlockSize / 2; ++k) {
      out[2 * k] = table[mant[k] & 0xfu];
      out[2 * k + 1] = table[mant[k] >> 4];
    }
  }
}

// ---- Dispatch on the format once per call --------------------------------------------------------------
template <typename Fn>
decltype(auto) with_format(Format f, Fn&& fn) {
  switch (f) {
    case Format::Bfp8_b: return fn(std::integral_constant<Format, Format::Bfp8_b>{});
    case Format::Bfp4_b: return fn(std::integral_constant<Format, Format::Bfp4_b>{});
  }
  throw Error("bfp: unknown block floating-point format " + std::to_string(static_cast<int>(f)));
}

// Offset (in values) of block p's first value inside a tile laid out row-major (row_major) or in face order.
inline size_t block_offset(int p, bool row_major) {
  return row_major ? static_cast<size_t>(block_row(p)) * kTileDim + block_col(p) : static_cast<size_t>(p) * kBlockSize;
}

template <Format F, typename T, typename Encode>
PackedMatrix pack_matrix_impl(const T* src, int64_t rows, int64_t cols, Encode encode_fn) {
  check(rows >= 0 && cols >= 0, "bfp: matrix shape must not be negative, found [" + std::to_string(rows) + ", " +
                                    std::to_string(cols) + "]");
  PackedMatrix pm;
  pm.format = F;
  pm.rows = rows;
  pm.cols = cols;
  const int64_t tr_n = pm.tile_rows(), tc_n = pm.tile_cols();
  pm.bytes.assign(static_cast<size_t>(tr_n * tc_n) * tile_bytes(F), 0);
  T pad[kBlockSize];
  for (int64_t tr = 0; tr < tr_n; ++tr)
    for (int64_t tc = 0; tc < tc_n; ++tc) {
      uint8_t* tile = pm.bytes.data() + static_cast<size_t>(tr * tc_n + tc) * tile_bytes(F);
      for (int p = 0; p < kBlocksPerTile; ++p) {
        const int64_t r = tr * kTileDim + block_row(p), c0 = tc * kTileDim + block_col(p);
        uint8_t* mant = tile + kBlocksPerTile + static_cast<size_t>(p) * block_bytes(F);
        if (r >= rows || c0 >= cols) continue;  // all padding: exponent 0, codes 0 (already zero)
        const T* row = src + r * cols + c0;
        if (c0 + kBlockSize <= cols) {
          tile[p] = encode_fn(row, mant);
        } else {  // right edge: pad the block with zeros
          std::fill(pad, pad + kBlockSize, T(0));
          std::copy(row, row + (cols - c0), pad);
          tile[p] = encode_fn(pad, mant);
        }
      }
    }
  return pm;
}

}  // namespace

const char* format_name(Format f) { return f == Format::Bfp8_b ? "bfp8_b" : "bfp4_b"; }

bool parse_format(const std::string& s, Format* out) {
  if (s == "bfp8_b") { *out = Format::Bfp8_b; return true; }
  if (s == "bfp4_b") { *out = Format::Bfp4_b; return true; }
  return false;
}

uint8_t shared_exponent(const float* v, int n) {
  uint32_t m = 0;
  for (int j = 0; j < n; ++j) m = std::max(m, (std::bit_cast<uint32_t>(v[j]) >> 23) & 0xffu);
  return static_cast<uint8_t>(m);
}

uint8_t encode(float x, uint8_t shared_exp, Format f) {
  // One lane of the block encoder; the other 15 lanes are zeros, which encode to 0 whatever the exponent.
  // A shared exponent below x's own is used as x's own: convert_u32_to_bfp shifts only when shared > own.
  u32x16 u{};
  u[0] = std::bit_cast<uint32_t>(x);
  const uint32_t shared = std::max<uint32_t>(shared_exp, (u[0] >> 23) & 0xffu);
  return f == Format::Bfp8_b ? encode_lanes<7>(u, shared)[0] : encode_lanes<3>(u, shared)[0];
}

float decode(uint8_t code, uint8_t shared_exp, Format f) {
  return std::bit_cast<float>(f == Format::Bfp8_b ? decode_exact<7>(code, shared_exp) : decode_exact<3>(code & 0xfu, shared_exp));
}

uint8_t encode_block(Format f, const float* v, uint8_t* mant) {
  return with_format(f, [&](auto F) { return encode_f32<decltype(F)::value>(v, mant); });
}

uint8_t encode_block_bf16(Format f, const uint16_t* v, uint8_t* mant) {
  return with_format(f, [&](auto F) { return encode_bf16<decltype(F)::value>(v, mant); });
}

void decode_block(Format f, uint8_t shared_exp, const uint8_t* mant, float* out) {
  with_format(f, [&](auto F) { decode_f32<decltype(F)::value>(shared_exp, mant, out); });
}

void quantize_block(Format f, const float* in, float* out, int n) {
  check(n >= 0 && n <= kBlockSize, "bfp: a block holds at most 16 values, found " + std::to_string(n));
  alignas(64) float v[kBlockSize] = {};
  std::copy(in, in + n, v);
  uint8_t mant[16];
  with_format(f, [&](auto F) {
    const uint8_t e = encode_f32<decltype(F)::value>(v, mant);
    decode_f32<decltype(F)::value>(e, mant, v);
  });
  std::copy(v, v + n, out);
}

void pack_tiles(Format f, const float* src, size_t n_tiles, bool row_major_input, uint8_t* dst) {
  with_format(f, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    for (size_t t = 0; t < n_tiles; ++t) {
      const float* in = src + t * kTileDim * kTileDim;
      uint8_t* tile = dst + t * tile_bytes(kF);
      for (int p = 0; p < kBlocksPerTile; ++p)
        tile[p] = encode_f32<kF>(in + block_offset(p, row_major_input), tile + kBlocksPerTile + p * block_bytes(kF));
    }
  });
}

std::vector<uint8_t> pack_tiles(Format f, const std::vector<float>& src, bool row_major_input) {
  constexpr size_t kTile = kTileDim * kTileDim;
  check(src.size() % kTile == 0, "bfp: pack_tiles needs whole 32x32 tiles (a multiple of 1024 values), found " +
                                     std::to_string(src.size()) + " values");
  std::vector<uint8_t> out(src.size() / kTile * tile_bytes(f));
  pack_tiles(f, src.data(), src.size() / kTile, row_major_input, out.data());
  return out;
}

void unpack_tiles(Format f, const uint8_t* src, size_t n_tiles, bool row_major_output, float* dst) {
  with_format(f, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    for (size_t t = 0; t < n_tiles; ++t) {
      const uint8_t* tile = src + t * tile_bytes(kF);
      float* out = dst + t * kTileDim * kTileDim;
      for (int p = 0; p < kBlocksPerTile; ++p)
        decode_f32<kF>(tile[p], tile_mantissas(kF, tile, p), out + block_offset(p, row_major_output));
    }
  });
}

void dequantize_tile(Format f, const uint8_t* tile, float* dst, size_t ld) {
  with_format(f, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    for (int p = 0; p < kBlocksPerTile; ++p)
      decode_f32<kF>(tile[p], tile_mantissas(kF, tile, p), dst + static_cast<size_t>(block_row(p)) * ld + block_col(p));
  });
}

PackedMatrix pack_matrix(Format f, const float* src, int64_t rows, int64_t cols) {
  return with_format(f, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    return pack_matrix_impl<kF>(src, rows, cols, [](const float* v, uint8_t* m) { return encode_f32<kF>(v, m); });
  });
}

PackedMatrix pack_matrix_bf16(Format f, const uint16_t* src, int64_t rows, int64_t cols) {
  return with_format(f, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    return pack_matrix_impl<kF>(src, rows, cols, [](const uint16_t* v, uint8_t* m) { return encode_bf16<kF>(v, m); });
  });
}

void PackedMatrix::dequantize_row(int64_t r, float* out) const {
  check(r >= 0 && r < rows, "bfp: row " + std::to_string(r) + " out of range [0, " + std::to_string(rows) + ")");
  with_format(format, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    alignas(64) float tmp[kBlockSize];
    const int64_t tr = r / kTileDim;
    const int rt = static_cast<int>(r % kTileDim);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlockSize) {
      const uint8_t* t = tile(tr, c0 / kTileDim);
      const int p = block_index(rt, static_cast<int>(c0 % kTileDim));
      if (c0 + kBlockSize <= cols) {
        decode_f32<kF>(t[p], tile_mantissas(kF, t, p), out + c0);
      } else {
        decode_f32<kF>(t[p], tile_mantissas(kF, t, p), tmp);
        std::copy(tmp, tmp + (cols - c0), out + c0);
      }
    }
  });
}

void PackedMatrix::unpack(float* out) const {
  for (int64_t r = 0; r < rows; ++r) dequantize_row(r, out + r * cols);
}

std::vector<float> PackedMatrix::unpack() const {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  unpack(v.data());
  return v;
}

void quantize_matrix(Format f, float* m, int64_t rows, int64_t cols) {
  check(rows >= 0 && cols >= 0, "bfp: matrix shape must not be negative");
  with_format(f, [&](auto F) {
    constexpr Format kF = decltype(F)::value;
    alignas(64) float v[kBlockSize];
    uint8_t mant[16];
    for (int64_t r = 0; r < rows; ++r) {
      float* row = m + r * cols;
      for (int64_t c0 = 0; c0 < cols; c0 += kBlockSize) {
        const int n = static_cast<int>(std::min<int64_t>(kBlockSize, cols - c0));
        std::fill(v, v + kBlockSize, 0.0f);
        std::copy(row + c0, row + c0 + n, v);
        const uint8_t e = encode_f32<kF>(v, mant);
        decode_f32<kF>(e, mant, v);
        std::copy(v, v + n, row + c0);
      }
    }
  });
}

}  // namespace alpamayo::bfp
