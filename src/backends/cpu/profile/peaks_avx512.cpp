// Register-only loops of the AVX-512 multiply-add instructions (peaks.h). An ISA translation unit (AVX-512
// flags, CMakeLists.txt): no weak symbols, no inline functions of headers called.
#include <immintrin.h>

#include "backends/cpu/profile/peaks.h"

namespace alpamayo::cpu {

// 12 accumulators: enough independent chains to cover latency (4-6 cycles) x 2 ports.
float peak_loop_dpbf16_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2 * 2;  // 16 lanes x 2 products x (mul + add)
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3c003c00 + (static_cast<int>(seed) & 1));
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(seed + i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  return out[0] + out[15];
}

float peak_loop_fma_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2;
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(seed * 1e-3f);
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(seed + i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  return out[0] + out[15];
}

float peak_loop_dpbusd_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 4 * 2;  // 16 lanes x 4 products x (mul + add)
  const __m512i a = _mm512_set1_epi32(0x01020304 + static_cast<int>(seed)), b = _mm512_set1_epi32(0x01010101);
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int out[16];
  _mm512_store_si512(out, s);
  return static_cast<float>(out[0] + out[15]);
}

float peak_loop_dpwssd_zmm(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 16 * 2 * 2;  // 16 lanes x 2 products x (mul + add)
  const __m512i a = _mm512_set1_epi32(0x00010002 + static_cast<int>(seed)), b = _mm512_set1_epi32(0x00010001);
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpwssd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int out[16];
  _mm512_store_si512(out, s);
  return static_cast<float>(out[0] + out[15]);
}

float peak_loop_dpbusd_ymm_evex(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 8 * 4 * 2;
  const __m256i a = _mm256_set1_epi32(0x01020304 + static_cast<int>(seed)), b = _mm256_set1_epi32(0x01010101);
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_dpbusd_epi32(acc[i], a, b);
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return static_cast<float>(out[0] + out[7]);
}

}  // namespace alpamayo::cpu

namespace alpamayo::cpu {
namespace {

// AMX palette 1: tiles 0-7 of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  unsigned char palette, start_row, reserved[14];
  unsigned short colsb[16];
  unsigned char rows[16];
};

// 4 accumulator tiles (0-3) fed by 2 A tiles (4, 5) and 2 B tiles (6, 7), the 2x2 blocking of an AMX matmul:
// 4 independent chains cover the instruction's latency. Operands are loaded once (registers only after that).
__attribute__((target("amx-tile,amx-bf16,amx-int8"))) float amx_loop(long iters, float seed, bool int8) {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  alignas(64) unsigned char in[1024];
  for (int i = 0; i < 1024; ++i) in[i] = static_cast<unsigned char>((i * 7 + static_cast<int>(seed)) & 0x3f);
  alignas(64) float out[256];
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only: without this the stores to the other
  // 56 bytes of cfg may be dropped (a palette of zeros: every tile instruction then faults).
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, in, 64);
  _tile_loadd(5, in, 64);
  _tile_loadd(6, in, 64);
  _tile_loadd(7, in, 64);
  if (int8)
    for (long it = 0; it < iters; ++it) {
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
  else
    for (long it = 0; it < iters; ++it) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  _tile_stored(3, out, 64);
  _tile_release();
  return out[0] + out[255];
}

}  // namespace

float peak_loop_amx_bf16(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 4.0 * 16 * 16 * 32 * 2;  // 4 tiles of 16x16 outputs, 32 bf16 products each, mul + add
  return amx_loop(iters, seed, false);
}

float peak_loop_amx_int8(long iters, float seed, double* ops_per_iter) {
  *ops_per_iter = 4.0 * 16 * 16 * 64 * 2;  // 64 u8 x s8 products per int32 output
  return amx_loop(iters, seed, true);
}

// 4 independent 512-bit streams of loads folded with xor (one port each cycle at most, far below DRAM rates).
uint64_t read_loop_avx512(const void* p, size_t bytes) {
  const __m512i* v = static_cast<const __m512i*>(p);
  const size_t n = bytes / 256;
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; ++i) {
    a = _mm512_xor_si512(a, _mm512_load_si512(v + 4 * i));
    b = _mm512_xor_si512(b, _mm512_load_si512(v + 4 * i + 1));
    c = _mm512_xor_si512(c, _mm512_load_si512(v + 4 * i + 2));
    d = _mm512_xor_si512(d, _mm512_load_si512(v + 4 * i + 3));
  }
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d)));
  return out[0] ^ out[7];
}

}  // namespace alpamayo::cpu
