// bfp8_b / bfp4_b: golden bits derived by hand from tt-metal's host code and its own unit tests, an independent
// slow reference of the same rules, round-trip properties and error bounds. tt-metal sources cited below:
//   blockfloat_common.cpp  tt_metal/impl/data_format/ (get_max_exp, convert_u32_to_bfp, pack_as_bfp_tiles)
//   bfloat8.cpp, bfloat4.cpp  same folder (unpack_bfp8_tiles_into_float_vec, unpack_bfp4_tiles_into_float_vec)
//   test_blockfloat_common.cpp  tests/tt_metal/tt_metal/api/ (ConvertU32ToBfpTests,
//                               HostBfpPack.NumericalBoundariesPreservePackedWords, FaceOrderPaddingAndNestedCallers)
//   test_bfp8_conversion.cpp  tests/tt_metal/tt_metal/ (HostOnlyTest.Bfp8Conversion, Bfp{4,8}ExponentSearch)
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "alpamayo/bfp.h"
#include "alpamayo/error.h"
#include "alpamayo/tensor.h"

namespace alpamayo::bfp {
namespace {

constexpr Format kBoth[] = {Format::Bfp8_b, Format::Bfp4_b};

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// ---- A deliberately naive reference of the rules, written from tt-metal's own test oracle -----------------
// Encode: as HostBfpPack.NumericalBoundariesPreservePackedWords computes its expected words: halve the
// significand once per exponent step, then integer division with round-half-even, saturate, sign if nonzero.
uint8_t ref_encode(uint32_t v, uint32_t shared, int w) {
  uint32_t e = (v >> 23) & 255;
  if (e == 0) return 0;
  uint32_t sig = (v & 0x7fffff) + 0x800000;
  while (e < shared) { sig /= 2; ++e; }
  const uint32_t div = 1u << (24 - w);
  uint32_t q = sig / div;
  const uint32_t rem = sig % div;
  if (rem > div / 2 || (rem == div / 2 && q % 2 == 1)) ++q;
  q = std::min(q, (1u << w) - 1);
  return static_cast<uint8_t>(q ? q | ((v >> 31) << w) : 0);
}

// Decode: convert_bfp_to_u32's normalisation loop plus the flush of unpack_bfp*_tiles_into_float_vec
// (shift count > shared exponent -> +0).
uint32_t ref_decode(uint32_t code, uint32_t shared, int w) {
  const uint32_t max = (1u << w) - 1, sign = (code >> w) & 1;
  uint32_t man = code & max;
  if (man == 0) return sign << 31;
  uint32_t shift = 0;
  while ((man & (1u << (w - 1))) == 0) { man <<= 1; ++shift; }
  man = (man << 1) & max;
  if (shift > shared) return 0;
  return (sign << 31) | ((shared - shift) << 23) | (man << (23 - w));
}

uint32_t max_exp(const uint32_t* u) {
  uint32_t m = 0;
  for (int j = 0; j < 16; ++j) m = std::max(m, (u[j] >> 23) & 255);
  return m;
}

// One tile from row-major values, by the layout rules spelled out directly: exponents of face 0 rows 0..15,
// face 1, 2, 3; then the same blocks' codes, bfp4 two per byte, low nibble first.
std::vector<uint8_t> ref_pack_tile(Format f, const float* rm) {
  const int w = mantissa_bits(f);
  std::vector<uint8_t> out(tile_bytes(f), 0);
  for (int face = 0; face < 4; ++face)
    for (int r = 0; r < 16; ++r) {
      uint32_t u[16];
      for (int j = 0; j < 16; ++j) u[j] = bits(rm[(16 * (face / 2) + r) * 32 + 16 * (face % 2) + j]);
      const int p = face * 16 + r;
      const uint32_t e = max_exp(u);
      out[p] = static_cast<uint8_t>(e);
      for (int j = 0; j < 16; ++j) {
        const uint8_t c = ref_encode(u[j], e, w);
        if (f == Format::Bfp8_b) out[64 + p * 16 + j] = c;
        else out[64 + p * 8 + j / 2] |= static_cast<uint8_t>(c << (4 * (j % 2)));
      }
    }
  return out;
}

std::vector<float> quantized(Format f, std::vector<float> v, int64_t rows, int64_t cols) {
  quantize_matrix(f, v.data(), rows, cols);
  return v;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i]) && ++bad <= 5)
      ADD_FAILURE() << what << " [" << i << "]: " << a[i] << " (0x" << std::hex << bits(a[i]) << ") vs " << b[i]
                    << " (0x" << bits(b[i]) << std::dec << ")";
  EXPECT_EQ(bad, 0u) << what;
}

// Values of very different scales per block, like the random data of tt-metal's exponent-search test.
std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(normal(rng), static_cast<int>((i / 16) % 31) - 15);
  return v;
}

// ---- Golden values from tt-metal's unit tests ----------------------------------------------------------

// test_blockfloat_common.cpp, ConvertU32ToBfpTests: shared exponent = the value's own (133 for 64..127), so
// bfp8_b codes are the value rounded to an integer with ties to even, 0x80 added for negatives.
TEST(BfpGolden, TtMetalMantissaRoundingCases) {
  struct Case { float in; uint8_t code; float out; };
  const Case cases[] = {{64.75f, 0x41, 65.f},   // round up (dropped bits 0x18000 > half)
                        {65.25f, 0x41, 65.f},   // round down (0x28000 -> 0x8000 < half)
                        {64.5f, 0x40, 64.f},    // tie, kept value even: down
                        {65.5f, 0x42, 66.f}};   // tie, kept value odd: up
  for (const Case& c : cases)
    for (float s : {1.f, -1.f}) {
      const float x = s * c.in;
      const uint8_t shared = static_cast<uint8_t>((bits(x) >> 23) & 255);
      EXPECT_EQ(shared, 133);
      const uint8_t code = encode(x, shared, Format::Bfp8_b);
      EXPECT_EQ(code, s > 0 ? c.code : c.code | 0x80) << x;
      EXPECT_EQ(decode(code, shared, Format::Bfp8_b), s * c.out) << x;
    }
}

// test_bfp8_conversion.cpp, HostOnlyTest.Bfp8Conversion: one tile holding 0..1023 row-major. Row-major input
// and the same values in face order pack to identical words; unpacking is within atol 8 / rtol 0.01.
// Exact bytes by hand (bfp8_b code = v * 2^(133 - shared)):
//   block 0  (face 0 row 0, values 0..15):   shared 130 (8..15), codes 8v = 0, 8, ..., 120;
//   block 16 (face 1 row 0, values 16..31):  shared 131, codes 4v = 64..124;
//   block 32 (face 2 row 0, values 512..527): shared 136, codes v/8: 513 -> 64, 516 (64.5, tie) -> 64,
//            517 -> 65, 524 (65.5, tie) -> 66, 527 -> 66;
//   block 63 (face 3 row 15, values 1008..1023): 1012 (126.5) -> 126, 1013 -> 127, and 1020 (127.5, tie to
//            odd) / 1023 (127.875) round to 128, which saturates at 127: both read back as 1016, not 1024.
TEST(BfpGolden, TtMetalTileOfIndices) {
  std::vector<float> rm(1024), faces(1024);
  for (int i = 0; i < 1024; ++i) rm[i] = static_cast<float>(i);
  for (int p = 0; p < 64; ++p)
    for (int j = 0; j < 16; ++j) faces[p * 16 + j] = rm[block_row(p) * 32 + block_col(p) + j];
  for (Format f : kBoth) {
    const auto a = pack_tiles(f, rm, true), b = pack_tiles(f, faces, false);
    EXPECT_EQ(a, b) << format_name(f);
    EXPECT_EQ(a, ref_pack_tile(f, rm.data())) << format_name(f);
    std::vector<float> back(1024), back_faces(1024);
    unpack_tiles(f, a.data(), 1, true, back.data());
    unpack_tiles(f, a.data(), 1, false, back_faces.data());
    for (int i = 0; i < 1024 && f == Format::Bfp8_b; ++i)
      EXPECT_LE(std::fabs(back[i] - rm[i]), 8.f + 0.01f * std::fabs(rm[i])) << i;
    for (int i = 0; i < 1024; ++i) EXPECT_EQ(bits(back_faces[i]), bits(back[block_row(i / 16) * 32 + block_col(i / 16) + i % 16])) << i;
  }
  const auto t = pack_tiles(Format::Bfp8_b, rm, true);
  const uint8_t* mant = t.data() + 64;
  EXPECT_EQ(t[0], 130);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(mant[j], 8 * j) << j;
  EXPECT_EQ(t[16], 131);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(mant[16 * 16 + j], 4 * (16 + j)) << j;
  EXPECT_EQ(t[32], 136);
  const uint8_t b32[16] = {64, 64, 64, 64, 64, 65, 65, 65, 65, 65, 65, 65, 66, 66, 66, 66};
  for (int j = 0; j < 16; ++j) EXPECT_EQ(mant[32 * 16 + j], b32[j]) << 512 + j;
  EXPECT_EQ(t[63], 136);
  EXPECT_EQ(mant[63 * 16 + 4], 126);   // 1012
  EXPECT_EQ(mant[63 * 16 + 5], 127);   // 1013
  EXPECT_EQ(mant[63 * 16 + 12], 127);  // 1020
  EXPECT_EQ(mant[63 * 16 + 15], 127);  // 1023
  std::vector<float> back(1024);
  unpack_tiles(Format::Bfp8_b, t.data(), 1, true, back.data());
  EXPECT_EQ(back[1012], 1008.f);
  EXPECT_EQ(back[1020], 1016.f);
  EXPECT_EQ(back[1023], 1016.f);
  EXPECT_EQ(back[516], 512.f);
  EXPECT_EQ(back[524], 528.f);
}

// test_bfp8_conversion.cpp, Bfp{4,8}ExponentSearch, the ordinary (no search) packing that test compares with:
// rows of one 1.0 and fifteen small values share exponent 127, so the first exponent word is 0x7f7f7f7f.
// By hand: bfp4_b 0.13 -> 0.13 * 4 = 0.52 -> code 1 -> 0.25; bfp8_b 0.008 -> 0.008 * 64 = 0.512 -> 1 -> 1/64.
TEST(BfpGolden, TtMetalExponentSearchInputsWithoutSearch) {
  for (Format f : kBoth) {
    const float small = f == Format::Bfp4_b ? 0.13f : 0.008f;
    std::vector<float> v(1024, small);
    for (size_t i = 0; i < v.size(); i += 16) v[i] = 1.0f;
    const auto t = pack_tiles(f, v, false);
    uint32_t word0;
    std::memcpy(&word0, t.data(), 4);
    EXPECT_EQ(word0, 0x7f7f7f7fu);
    std::vector<float> back(1024);
    unpack_tiles(f, t.data(), 1, false, back.data());
    EXPECT_EQ(back[0], 1.0f);
    EXPECT_EQ(back[1], f == Format::Bfp4_b ? 0.25f : 0.015625f);
  }
}

// The special inputs that test lists (zeros, +-1, denorm_min, FLT_MIN, +-Inf, NaN), each filling a whole
// tile: exponent byte and code, by hand from convert_u32_to_bfp.
TEST(BfpGolden, TtMetalSpecialInputsFillingATile) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Case { float v; uint8_t exp, code8, code4; };
  const Case cases[] = {
      {0.0f, 0, 0, 0},
      {-0.0f, 0, 0, 0},                                          // no signed zero
      {1.0f, 127, 0x40, 0x4},                                    // hidden bit only
      {-1.0f, 127, 0xc0, 0xc},
      {std::numeric_limits<float>::denorm_min(), 0, 0, 0},      // exponent field 0: flushed
      {std::numeric_limits<float>::min(), 1, 0x40, 0x4},
      {inf, 255, 0x40, 0x4},                                     // Inf: exponent 255, hidden bit only
      {-inf, 255, 0xc0, 0xc},
      {std::numeric_limits<float>::quiet_NaN(), 255, 0x60, 0x6}  // 0x7fc00000: hidden bit + top fraction bit
  };
  for (const Case& c : cases)
    for (Format f : kBoth) {
      const std::vector<float> v(1024, c.v);
      const auto t = pack_tiles(f, v, true);
      const uint8_t code = f == Format::Bfp8_b ? c.code8 : c.code4;
      for (int p = 0; p < 64; ++p) ASSERT_EQ(t[p], c.exp) << c.v << " " << format_name(f);
      const uint8_t byte = f == Format::Bfp8_b ? code : static_cast<uint8_t>(code | code << 4);
      for (size_t i = 64; i < t.size(); ++i) ASSERT_EQ(t[i], byte) << c.v << " " << format_name(f);
    }
}

// test_blockfloat_common.cpp, HostBfpPack.NumericalBoundariesPreservePackedWords: 16 raw words mixing ties at
// one exponent, opposite signs, zero / denormal flushing and shifts past the word width, for many exponents;
// expected codes from the naive reference above (the same oracle that test uses).
TEST(BfpGolden, TtMetalNumericalBoundaries) {
  for (Format f : kBoth) {
    const int w = mantissa_bits(f);
    const uint32_t drop = 24 - w;
    for (uint32_t e : {0u, 1u, 111u, 112u, 113u, 126u, 127u, 143u, 144u, 254u, 255u}) {
      const uint32_t raw[16] = {0u, 0x80000000u, 1u, 0x80000001u, e << 23, (e << 23) | 0x80000000u,
                                (e << 23) | ((1u << (drop - 1)) - 1), (e << 23) | (1u << (drop - 1)),
                                (e << 23) | ((1u << (drop - 1)) + 1), (e << 23) | 0x7fffffu,
                                (e << 23) | 0x807fffffu, 0x00800000u, 0x37800000u, 0x38000000u,
                                0x3f800000u, 0xbf800000u};
      float v[16];
      std::memcpy(v, raw, sizeof v);
      uint8_t mant[16] = {};
      const uint8_t shared = encode_block(f, v, mant);
      EXPECT_EQ(shared, max_exp(raw)) << e;
      for (int j = 0; j < 16; ++j) {
        const uint8_t want = ref_encode(raw[j], shared, w);
        const uint8_t got = f == Format::Bfp8_b ? mant[j] : static_cast<uint8_t>((mant[j / 2] >> (4 * (j % 2))) & 0xf);
        EXPECT_EQ(got, want) << format_name(f) << " e=" << e << " lane " << j;
        EXPECT_EQ(encode(v[j], shared, f), want) << format_name(f) << " e=" << e << " lane " << j;
      }
    }
  }
}

// ---- Edge cases derived by hand ------------------------------------------------------------------------

TEST(BfpEdge, ZerosNegativeZeroAndDenormalsGiveZeroBlocks) {
  for (Format f : kBoth) {
    float v[16] = {0.0f, -0.0f, 1e-40f, -1e-40f, std::numeric_limits<float>::denorm_min()};
    uint8_t mant[16];
    std::memset(mant, 0xaa, sizeof mant);
    EXPECT_EQ(encode_block(f, v, mant), 0);  // the maximum exponent field of zeros and denormals is 0
    for (size_t k = 0; k < block_bytes(f); ++k) EXPECT_EQ(mant[k], 0) << k;
    float out[16];
    decode_block(f, 0, mant, out);
    for (float x : out) EXPECT_EQ(bits(x), 0u);  // +0.0: -0.0 loses its sign
    // A denormal next to a normal value is flushed too, whatever the shared exponent.
    v[5] = std::ldexp(1.5f, -126);  // exponent field 1: codes 96 (bfp8_b) / 6 (bfp4_b), exact
    quantize_block(f, v, out);
    EXPECT_EQ(bits(out[2]), 0u);
    EXPECT_EQ(bits(out[3]), 0u);
    EXPECT_EQ(out[5], std::ldexp(1.5f, -126));
  }
}

// A block maximum far above the rest: each value keeps only the bits at and above 2^(shared-127-(W-1)).
TEST(BfpEdge, BlockMaximumFarAboveTheRest) {
  float v[16] = {1024.0f, 1.0f, -3.0f, 0.5f, 8.0f, 12.0f, -24.0f, 4.0f};
  float q8[16], q4[16];
  quantize_block(Format::Bfp8_b, v, q8);  // shared 137: grid step 2^(137-133) = 16
  EXPECT_EQ(q8[0], 1024.0f);
  EXPECT_EQ(q8[1], 0.0f);    // 1/16 of a step
  EXPECT_EQ(q8[2], 0.0f);    // -3/16: magnitude 0, so no sign: +0.0
  EXPECT_EQ(bits(q8[2]), 0u);
  EXPECT_EQ(q8[4], 0.0f);    // 8 = half a step, tie to even 0
  EXPECT_EQ(q8[5], 16.0f);   // 12 = 0.75 step
  EXPECT_EQ(q8[6], -32.0f);  // -24 = 1.5 steps, tie to even 2
  quantize_block(Format::Bfp4_b, v, q4);  // grid step 2^(137-129) = 256
  EXPECT_EQ(q4[0], 1024.0f);
  for (int j = 1; j < 16; ++j) EXPECT_EQ(bits(q4[j]), 0u) << j;
  // With the maximum at 128 (shared 134, bfp8_b step 2): 1.0 is a tie that goes to 0, 3.0 one that goes to 4.
  float w[16] = {128.0f, 1.0f, 3.0f, 5.0f};
  quantize_block(Format::Bfp8_b, w, q8);
  EXPECT_EQ(q8[1], 0.0f);
  EXPECT_EQ(q8[2], 4.0f);
  EXPECT_EQ(q8[3], 4.0f);
}

// Rounding never carries into the exponent: a magnitude that rounds to 2^W saturates at 2^W - 1.
TEST(BfpEdge, RoundingCarrySaturatesInsteadOfRaisingTheExponent) {
  float v[16] = {1.99609375f, 0.5f};  // 127.75 / 64
  uint8_t mant[16];
  EXPECT_EQ(encode_block(Format::Bfp8_b, v, mant), 127);
  EXPECT_EQ(mant[0], 0x7f);
  EXPECT_EQ(mant[1], 0x20);
  float out[16];
  decode_block(Format::Bfp8_b, 127, mant, out);
  EXPECT_EQ(out[0], 1.984375f);  // not 2.0
  EXPECT_EQ(out[1], 0.5f);
  float u[16] = {-1.9f, 1.0f};    // bfp4_b: 7.6 -> 8 -> 7
  EXPECT_EQ(encode_block(Format::Bfp4_b, u, mant), 127);
  EXPECT_EQ(mant[0], 0x4f);      // value 0 in the low nibble (0xf = sign | 7), value 1 in the high one (4)
  decode_block(Format::Bfp4_b, 127, mant, out);
  EXPECT_EQ(out[0], -1.75f);
  EXPECT_EQ(out[1], 1.0f);
  // FLT_MAX: 127.99... saturates too, and reads back finite.
  float m[16] = {std::numeric_limits<float>::max()};
  quantize_block(Format::Bfp8_b, m, out);
  EXPECT_EQ(bits(out[0]), 0x7f7e0000u);
}

// Inf / NaN take part like any value with exponent field 255 (tt-metal has no special case): the block's
// exponent becomes 255, smaller values are shifted away, and the codes read back through the bit-level
// unpack: Inf -> Inf, quiet NaN -> the same NaN, a NaN whose payload rounds to the hidden bit -> Inf.
TEST(BfpEdge, InfAndNanFollowTheBitRules) {
  const float inf = std::numeric_limits<float>::infinity();
  for (Format f : kBoth) {
    float v[16] = {inf, 1.0f, -inf, from_bits(0x7fc00000u), from_bits(0xffc00000u), from_bits(0x7f800001u),
                   std::ldexp(1.0f, 127), -3.0e38f};
    uint8_t mant[16];
    EXPECT_EQ(encode_block(f, v, mant), 255);
    float out[16];
    decode_block(f, 255, mant, out);
    EXPECT_EQ(out[0], inf);
    EXPECT_EQ(bits(out[1]), 0u);
    EXPECT_EQ(out[2], -inf);
    EXPECT_EQ(bits(out[3]), 0x7fc00000u);
    EXPECT_EQ(bits(out[4]), 0xffc00000u);
    EXPECT_EQ(out[5], inf);  // 0x7f800001: hidden bit + 1 ulp, the ulp rounds away
    EXPECT_EQ(out[6], std::ldexp(1.0f, 127));  // exponent 254 in a 255 block: half the hidden bit, exact
    // -3e38 = -1.763 * 2^127, half of that at exponent 255: bfp8_b keeps 56.4 -> 56 (finite); bfp4_b rounds
    // 3.53 up to 4, the hidden bit at exponent 255, which reads back as -Inf.
    if (f == Format::Bfp8_b) EXPECT_EQ(out[7], -std::ldexp(56.0f, 122));
    else EXPECT_EQ(bits(out[7]), 0xff800000u);
  }
}

// decode() for codes pack() never writes below FLT_MIN: tt-metal flushes when the normalising shift exceeds
// the shared exponent and otherwise writes exponent field shared - shift, which at 0 drops the leading one.
TEST(BfpEdge, DecodeBelowFltMinFollowsTtMetalsUnpack) {
  // bfp8_b: code 1 at shared 7 is 2^-126 = FLT_MIN exactly; at 6 the shift (6) equals the exponent: field 0
  // and no fraction bits left: +0; at 5 the shift exceeds it: +0, sign dropped.
  EXPECT_EQ(decode(1, 7, Format::Bfp8_b), std::numeric_limits<float>::min());
  EXPECT_EQ(bits(decode(1, 6, Format::Bfp8_b)), 0u);
  EXPECT_EQ(bits(decode(0x81, 5, Format::Bfp8_b)), 0u);
  // code 3 at shared 5: shift 5, field 0, fraction 0x40 -> the denormal 2^-127, not 3 * 2^-128.
  EXPECT_EQ(bits(decode(3, 5, Format::Bfp8_b)), 0x00400000u);
  EXPECT_EQ(bits(decode(0x83, 5, Format::Bfp8_b)), 0x80400000u);
  // A sign with magnitude 0 reads as -0.0 on the host (the packer never writes it).
  EXPECT_EQ(bits(decode(0x80, 100, Format::Bfp8_b)), 0x80000000u);
  EXPECT_EQ(bits(decode(0x8, 100, Format::Bfp4_b)), 0x80000000u);
  // bfp4_b: code 3 at shared 1: shift 1, field 0, fraction 0b100 -> 0x00400000; code 1 at shared 1: +0.
  EXPECT_EQ(bits(decode(3, 1, Format::Bfp4_b)), 0x00400000u);
  EXPECT_EQ(bits(decode(1, 1, Format::Bfp4_b)), 0u);
  EXPECT_EQ(decode(1, 3, Format::Bfp4_b), std::numeric_limits<float>::min());
}

// Decoding agrees with the bit-level reference for every (code, exponent) pair, through the block path
// (its float-multiply shortcut) and the scalar one.
TEST(BfpEdge, DecodeMatchesReferenceExhaustively) {
  for (Format f : kBoth) {
    const int w = mantissa_bits(f), ncodes = 1 << (w + 1);
    for (int e = 0; e < 256; ++e)
      for (int c0 = 0; c0 < ncodes; c0 += 16) {
        uint8_t codes[16], mant[16] = {};
        for (int j = 0; j < 16; ++j) codes[j] = static_cast<uint8_t>((c0 + j) % ncodes);
        for (int j = 0; j < 16; ++j) {
          if (f == Format::Bfp8_b) mant[j] = codes[j];
          else mant[j / 2] |= static_cast<uint8_t>(codes[j] << (4 * (j % 2)));
        }
        float out[16];
        decode_block(f, static_cast<uint8_t>(e), mant, out);
        for (int j = 0; j < 16; ++j) {
          const uint32_t want = ref_decode(codes[j], e, w);
          ASSERT_EQ(bits(out[j]), want) << format_name(f) << " e=" << e << " code=" << int(codes[j]);
          ASSERT_EQ(bits(decode(codes[j], static_cast<uint8_t>(e), f)), want);
        }
      }
  }
}

// ---- Layout ----------------------------------------------------------------------------------------------

// Every block gets its own exponent and every lane its own code, so each byte proves where it went (the
// construction of FaceOrderPaddingAndNestedCallers): element (r, c) = (-1)^(lane % 2) * (64 + lane) *
// 2^(x - 133) with lane = c % 16 and x = 100 + r * 2 + c / 16; its block is p = face * 16 + r % 16.
TEST(BfpLayout, TileExponentsFirstThenFacesRowByRow) {
  std::vector<float> rm(1024);
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 32; ++c) {
      const uint32_t lane = c % 16, x = 100 + r * 2 + c / 16;
      rm[r * 32 + c] = from_bits(((lane % 2) << 31) | (x << 23) | (lane << 17));
    }
  for (Format f : kBoth) {
    const auto t = pack_tiles(f, rm, true);
    ASSERT_EQ(t.size(), tile_bytes(f));
    for (int face = 0; face < 4; ++face)
      for (int rr = 0; rr < 16; ++rr) {
        const int p = face * 16 + rr, r = (face / 2) * 16 + rr, c0 = (face % 2) * 16;
        EXPECT_EQ(block_index(r, c0), p);
        EXPECT_EQ(block_row(p), r);
        EXPECT_EQ(block_col(p), c0);
        EXPECT_EQ(t[p], 100 + r * 2 + c0 / 16) << p;
        for (int lane = 0; lane < 16; ++lane) {
          // bfp8_b keeps 64 + lane; bfp4_b rounds (64 + lane) / 16 = 4 + lane/16: 4 up to lane 8 (a tie, to
          // even), 5 above.
          uint8_t want = f == Format::Bfp8_b ? static_cast<uint8_t>(64 + lane) : static_cast<uint8_t>(lane > 8 ? 5 : 4);
          if (lane % 2) want |= static_cast<uint8_t>(1 << mantissa_bits(f));
          const uint8_t got = f == Format::Bfp8_b ? t[64 + p * 16 + lane]
                                                  : static_cast<uint8_t>((t[64 + p * 8 + lane / 2] >> (4 * (lane % 2))) & 0xf);
          EXPECT_EQ(got, want) << format_name(f) << " p=" << p << " lane=" << lane;
        }
      }
    EXPECT_EQ(t, ref_pack_tile(f, rm.data()));
  }
}

// bfp4_b packs value 2k in the low nibble of byte k (tt-metal fills each uint32 from its low bits).
TEST(BfpLayout, Bfp4NibbleOrder) {
  float v[16] = {1.0f, 1.25f, -1.5f, 1.75f};  // codes 4, 5, 8|6 = 0xe, 7
  uint8_t mant[8];
  EXPECT_EQ(encode_block(Format::Bfp4_b, v, mant), 127);
  EXPECT_EQ(mant[0], 0x54);
  EXPECT_EQ(mant[1], 0x7e);
  for (int k = 2; k < 8; ++k) EXPECT_EQ(mant[k], 0);
}

// Matrices: tiles in row-major tile order, zero padding to multiples of 32 (ttnn pads before tilizing).
TEST(BfpLayout, MatrixTileOrderAndPadding) {
  for (Format f : kBoth) {
    const int64_t rows = 64, cols = 96;
    const auto m = random_matrix(rows, cols, 7);
    const PackedMatrix pm = pack_matrix(f, m.data(), rows, cols);
    ASSERT_EQ(pm.bytes.size(), 6 * tile_bytes(f));
    for (int64_t tr = 0; tr < 2; ++tr)
      for (int64_t tc = 0; tc < 3; ++tc) {
        std::vector<float> tile(1024);
        for (int r = 0; r < 32; ++r)
          for (int c = 0; c < 32; ++c) tile[r * 32 + c] = m[(tr * 32 + r) * cols + tc * 32 + c];
        const auto want = ref_pack_tile(f, tile.data());
        EXPECT_EQ(std::vector<uint8_t>(pm.tile(tr, tc), pm.tile(tr, tc) + tile_bytes(f)), want) << tr << "," << tc;
      }
    // 40 x 50: 2 x 2 tiles; the padded matrix packs to the same bytes.
    const int64_t r2 = 40, c2 = 50;
    const auto small = random_matrix(r2, c2, 8);
    std::vector<float> padded(64 * 64, 0.0f);
    for (int64_t r = 0; r < r2; ++r)
      for (int64_t c = 0; c < c2; ++c) padded[r * 64 + c] = small[r * c2 + c];
    const PackedMatrix a = pack_matrix(f, small.data(), r2, c2), b = pack_matrix(f, padded.data(), 64, 64);
    EXPECT_EQ(a.tile_rows(), 2);
    EXPECT_EQ(a.tile_cols(), 2);
    EXPECT_EQ(a.bytes, b.bytes);
    const auto back = a.unpack();
    ASSERT_EQ(back.size(), size_t(r2 * c2));
    expect_same_bits(back, quantized(f, small, r2, c2), "padded unpack vs quantize");
    for (int64_t r = 0; r < r2; ++r)
      for (int64_t c0 = 0; c0 < c2; c0 += 16) {
        EXPECT_EQ(a.block_exponent(r, c0), shared_exponent(&padded[r * 64 + c0]));
      }
  }
}

TEST(BfpLayout, TileAndRowDequantisersAgreeWithUnpack) {
  for (Format f : kBoth) {
    const int64_t rows = 64, cols = 64;
    const auto m = random_matrix(rows, cols, 9);
    const PackedMatrix pm = pack_matrix(f, m.data(), rows, cols);
    const auto all = pm.unpack();
    std::vector<float> via_tiles(rows * cols);
    for (int64_t tr = 0; tr < 2; ++tr)
      for (int64_t tc = 0; tc < 2; ++tc)
        dequantize_tile(f, pm.tile(tr, tc), via_tiles.data() + tr * 32 * cols + tc * 32, cols);
    expect_same_bits(via_tiles, all, "dequantize_tile");
    std::vector<float> row(cols);
    pm.dequantize_row(37, row.data());
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(bits(row[c]), bits(all[37 * cols + c])) << c;
    float blk[16];
    decode_block(f, pm.block_exponent(37, 48), pm.block_mantissas(37, 48), blk);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(bits(blk[j]), bits(all[37 * cols + 48 + j])) << j;
  }
}

// ---- Properties over random data -------------------------------------------------------------------------

// The block encoder against the naive reference on random bit patterns, half of them with forced exponents
// so that every exponent is seen (the data of tt-metal's BfpSimdRows test), plus every bf16 bit pattern.
TEST(BfpProperty, EncoderMatchesReferenceOnRandomBitsAndAllBf16) {
  std::mt19937 rng(5127);
  for (Format f : kBoth) {
    const int w = mantissa_bits(f);
    for (uint32_t row = 0; row < 8192; ++row) {
      uint32_t u[16];
      for (int j = 0; j < 16; ++j) {
        u[j] = rng();
        if (row % 2 == 0) u[j] = (u[j] & 0x807fffffu) | ((row % 256) << 23);
        if (row % 4 == 1) u[j] = (u[j] & 0x80ffffffu) | (((row / 4) % 256) << 23);  // exponents within 2 of each other
      }
      float v[16];
      std::memcpy(v, u, sizeof v);
      uint8_t mant[16] = {};
      const uint8_t e = encode_block(f, v, mant);
      ASSERT_EQ(e, max_exp(u));
      for (int j = 0; j < 16; ++j) {
        const uint8_t got = f == Format::Bfp8_b ? mant[j] : static_cast<uint8_t>((mant[j / 2] >> (4 * (j % 2))) & 0xf);
        ASSERT_EQ(got, ref_encode(u[j], e, w)) << format_name(f) << " row " << row << " lane " << j;
      }
    }
    for (uint32_t row = 0; row < 4096; ++row) {
      uint16_t h[16];
      float v[16];
      for (int j = 0; j < 16; ++j) {
        h[j] = static_cast<uint16_t>(row * 16 + j);
        v[j] = bf16_to_f32(h[j]);
      }
      uint8_t a[16] = {}, b[16] = {};
      ASSERT_EQ(encode_block_bf16(f, h, a), encode_block(f, v, b));
      ASSERT_EQ(0, std::memcmp(a, b, block_bytes(f))) << row;
    }
  }
}

TEST(BfpProperty, Bf16MatrixPacksLikeItsFloatExpansion) {
  for (Format f : kBoth) {
    const auto m = random_matrix(32, 80, 11);
    std::vector<uint16_t> h(m.size());
    std::vector<float> e(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      h[i] = f32_to_bf16(m[i]);
      e[i] = bf16_to_f32(h[i]);
    }
    EXPECT_EQ(pack_matrix_bf16(f, h.data(), 32, 80).bytes, pack_matrix(f, e.data(), 32, 80).bytes);
  }
}

// unpack(pack(x)) == quantize(x) bit for bit; quantising twice changes nothing; re-packing the unpacked values
// gives the same bytes, also for random bit patterns with NaN, Inf and denormals.
TEST(BfpProperty, RoundTripsAndIdempotence) {
  for (Format f : kBoth) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 128}, {33, 47}, {1, 16}, {5, 3}}) {
      const auto m = random_matrix(rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
      const PackedMatrix pm = pack_matrix(f, m.data(), rows, cols);
      const auto q = quantized(f, m, rows, cols);
      expect_same_bits(pm.unpack(), q, "unpack(pack) vs quantize");
      expect_same_bits(quantized(f, q, rows, cols), q, "quantize twice");
      EXPECT_EQ(pack_matrix(f, q.data(), rows, cols).bytes, pm.bytes);
      std::vector<float> qb(q.size());
      for (size_t i = 0; i < q.size(); i += 16) quantize_block(f, m.data() + i, qb.data() + i, int(std::min<size_t>(16, q.size() - i)));
      if (cols % 16 == 0) expect_same_bits(qb, q, "quantize_block");
    }
    std::mt19937 rng(99);
    std::vector<float> raw(32 * 64);
    for (float& x : raw) x = from_bits(static_cast<uint32_t>(rng()));
    std::vector<uint8_t> t(2 * tile_bytes(f)), t2(t.size());
    pack_tiles(f, raw.data(), 2, true, t.data());
    std::vector<float> back(raw.size());
    unpack_tiles(f, t.data(), 2, true, back.data());
    pack_tiles(f, back.data(), 2, true, t2.data());
    EXPECT_EQ(t, t2) << format_name(f);
    for (size_t k = 0; k < 2; ++k)
      EXPECT_EQ(std::vector<uint8_t>(t.begin() + k * tile_bytes(f), t.begin() + (k + 1) * tile_bytes(f)),
                ref_pack_tile(f, raw.data() + k * 1024)) << format_name(f) << " tile " << k;
  }
}

// Error bounds relative to the block: with g = 2^(shared - 127 - (W-1)) the grid step, each finite value is
// within g/2 (round to nearest), or within g when its magnitude saturated at 2^W - 1; both are at most
// 2^-(W-1) of the block's largest magnitude (2^-6 for bfp8_b, 2^-2 for bfp4_b). Values below FLT_MIN flush.
TEST(BfpProperty, ErrorIsBoundedByTheBlockMaximum) {
  for (Format f : kBoth) {
    const int w = mantissa_bits(f);
    const int64_t rows = 256, cols = 256;
    const auto m = random_matrix(rows, cols, 1234);
    const auto q = quantized(f, m, rows, cols);
    double worst_rel = 0;
    for (int64_t b = 0; b < rows * cols; b += 16) {
      const uint8_t e = shared_exponent(&m[b]);
      const double g = std::ldexp(1.0, e - 127 - (w - 1));
      double amax = 0;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(double(m[b + j])));
      for (int j = 0; j < 16; ++j) {
        const double x = m[b + j], err = std::fabs(double(q[b + j]) - x);
        const bool saturated = std::fabs(double(q[b + j])) == ((1 << w) - 1) * g;
        ASSERT_LE(err, saturated ? g : g / 2) << format_name(f) << " " << b + j;
        ASSERT_LE(err, std::ldexp(amax, -(w - 1))) << format_name(f) << " " << b + j;
        worst_rel = std::max(worst_rel, err / amax);
        // Sign is kept or the value is 0.
        ASSERT_TRUE(q[b + j] == 0.0f || std::signbit(q[b + j]) == std::signbit(m[b + j]));
      }
    }
    EXPECT_GT(worst_rel, std::ldexp(1.0, -(w + 1)));  // the bound is not vacuous on this data
  }
}

TEST(BfpApi, FormatsNamesSizesAndErrors) {
  EXPECT_EQ(tile_bytes(Format::Bfp8_b), 1088u);
  EXPECT_EQ(tile_bytes(Format::Bfp4_b), 576u);
  Format f;
  ASSERT_TRUE(parse_format("bfp4_b", &f));
  EXPECT_EQ(f, Format::Bfp4_b);
  ASSERT_TRUE(parse_format(format_name(Format::Bfp8_b), &f));
  EXPECT_EQ(f, Format::Bfp8_b);
  EXPECT_FALSE(parse_format("bfp8", &f));
  EXPECT_THROW(pack_tiles(Format::Bfp8_b, std::vector<float>(1000), true), Error);
  EXPECT_THROW(pack_matrix(Format::Bfp8_b, nullptr, -1, 4), Error);
  const PackedMatrix empty = pack_matrix(Format::Bfp4_b, nullptr, 0, 0);
  EXPECT_TRUE(empty.bytes.empty());
  float x[16] = {};
  EXPECT_THROW(quantize_block(Format::Bfp8_b, x, x, 17), Error);
  // encode() with a shared exponent below the value's own behaves as tt-metal: no shift.
  EXPECT_EQ(encode(3.0f, 100, Format::Bfp8_b), encode(3.0f, 128, Format::Bfp8_b));
}

}  // namespace
}  // namespace alpamayo::bfp
