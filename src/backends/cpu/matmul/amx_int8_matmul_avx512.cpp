// "amx_int8" of matmul_kernels.h: int8 weights on AMX tiles (tdpbusd), compiled with the AVX-512 flags
// (CMakeLists.txt) and the AMX ones per function; called only where isa() grants AMX-INT8 (the OS permission
// included, isa.cpp).
//
// Why: at the seed's 64 rows a step makes one pass over the weights, so the matmul phases are bound by the read
// bandwidth if the weights stream without pause; oneDNN's AMX int8 brgemm leaves the streaming to the hardware
// prefetchers. Per byte of weights the tile work is amx_bf16's (one tdpbusd per 1 KB B tile and 16 rows of x),
// over half the bytes of bf16 weights (docs/CPU_BACKEND.md, "AMX int8 matmul").
//
// Sums: tdpbusd multiplies u8 x = q + 128 by s8 w and adds groups of 4 products to int32 accumulators, exactly (no
// saturation; K <= kVnniMaxK keeps every partial sum in range). The kernel subtracts 128 x the column sum of w
// (packed with the weights) and rounds the exact int32 result once to fp32: avx512_vnni's value, bit for bit,
// whatever the order of the int32 additions, M, N or the column slice.
//
// Layout: avx512_vnni's (MatmulWeights::pack*): panels of 64 columns, K in spans of kDotKSpan, rows in quads of k,
// [ks/4][64][4] s8 per span-panel: 256 bytes a packed row, so the B tile of 16 columns x 16 quads (64 k) is 16
// rows of 64 bytes at a stride of 256 bytes, read in place.
// Loop (amx_bf16's): per group of panels (one panel below kAmxManyRows rows, kGroupPanels from there: blocking()),
// per chunk of kChunkQuads quads (128 KB of a panel's weights: stays in L2 with x's chunk and the next chunk), per
// panel of the group, per half panel (32 columns) and 32-row block (in the order blocking() says), the 2 x 2 tiles
// of int32 accumulators (tmm0-3) run over the chunk with 2 A tiles (x, tmm4-5) and 2 B tiles (tmm6-7). Partial sums
// go to an int32 buffer per panel of the group between chunks. Meanwhile the next chunk is prefetched into L2
// (prefetcht1), a few lines per k step, spread evenly over the chunk's work, so DRAM streams during all of the
// compute. Quads past the last whole group of 16 (K not a multiple of 64) are added after the tiles, in int32.
//
// Nothing here may instantiate an inline or template function with external linkage (scripts/check-isa-objects.sh).
// GCC 12's own AVX-512 intrinsics (the shift and the conversion in finish) warn of their undefined pass-through
// operand.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 64;             // columns per panel
constexpr int kChunkQuads = 512;    // k quads per chunk: 512 x 256 bytes = 128 KB of one panel's weights
constexpr int kRowBytes = kNR * 4;  // one packed row: 64 columns x a quad of s8
constexpr int kTileK = 64;          // k per A tile row (64 u8), and per B tile (16 quads)
static_assert(kDotKSpan % (4 * kChunkQuads) == 0, "chunks must not straddle spans");

// amx_bf16's blocking (amx_matmul_avx512.cpp, docs/PERFORMANCE.md): at many rows the tile loads' source sets the
// rate, so a group of panels runs per chunk of k (the chunk's x, all rows, read from L2 by each panel of the group
// instead of from L3 by every panel) and each row block's two half panels back to back; at few rows one panel at
// a time, half panels outer, the weights streaming from memory.
constexpr int kGroupPanels = 4;  // with kChunkQuads: 768 KB of x and 384 KB of sums at 384 rows, in L2
struct Blocking {
  int group_panels;
  bool rows_outer;
};
Blocking blocking(int M32) { return M32 < kAmxManyRows ? Blocking{1, false} : Blocking{kGroupPanels, true}; }

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// The scratch: x as u8, K rounded up to Kp (a multiple of 64) and M to M32 rows, zero-padded, in A tiles: for
// each 16 rows, for each 64 k, the tile's 16 x 64 u8 contiguous (1 KB; amx_bf16 measured contiguous tiles faster
// than rows at a stride of a multiple of 4 KB). Then the int32 partial sums of one panel [M32][64].
size_t xs_index(int m, int k, int Kp) {
  return (size_t(m / 16) * (Kp / kTileK) + k / kTileK) * 1024 + (m % 16) * kTileK + k % kTileK;
}
struct Scratch {
  uint8_t* xs;
  int32_t* part;
};
Scratch carve(void* scratch, int M32, int Kp) {
  char* p = static_cast<char*>(scratch);
  const size_t xs_bytes = (size_t(M32) * Kp + 63) / 64 * 64;
  return {reinterpret_cast<uint8_t*>(p), reinterpret_cast<int32_t*>(p + xs_bytes)};
}

// One span-panel's chunk of `quads` (a multiple of 16) k quads starting at k kx0 of x: every 32-row block and
// both half panels (in the order rows_outer says, as amx_bf16), accumulating into part (first: start from zero).
// Prefetches [pf, pf_end) spread over its k steps.
__attribute__((target("amx-tile,amx-int8"))) void chunk(const char* b, int quads, const uint8_t* xs, int Kp, int M32,
                                                        int kx0, int32_t* part, bool first, bool rows_outer,
                                                        const char* pf, const char* pf_end) {
  const int blocks = M32 / 32, steps = quads / 16 * 2 * blocks;
  const size_t pf_total = pf < pf_end ? size_t(pf_end - pf) : 0;
  const size_t per_step = (pf_total / (steps > 0 ? steps : 1) + 63) / 64 * 64;
  for (int i = 0; i < 2 * blocks; ++i) {
    const int h = rows_outer ? i % 2 : i / blocks, r = 32 * (rows_outer ? i / 2 : i % blocks);
    int32_t* c = part + size_t(r) * kNR + h * 32;
    if (first) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    } else {
      _tile_loadd(0, c, kNR * 4);
      _tile_loadd(1, c + 16, kNR * 4);
      _tile_loadd(2, c + 16 * kNR, kNR * 4);
      _tile_loadd(3, c + 16 * kNR + 16, kNR * 4);
    }
    const uint8_t* a = xs + xs_index(r, kx0, Kp);
    const char* bh = b + h * 128;
    // Each operand tile is loaded again for the next step as soon as its last product of this step has been
    // issued: the tiles are not renamed, so a load waits for the products reading the tile it overwrites.
    _tile_loadd(4, a, kTileK);
    _tile_loadd(6, bh, kRowBytes);
    _tile_loadd(5, a + size_t(16) * Kp, kTileK);
    _tile_loadd(7, bh + 64, kRowBytes);
    for (int q = 0; q < quads; q += 16) {
      // The last step loads its own tiles again (in bounds, unused): fewer branches in the loop.
      const int n = q + 16 < quads ? q + 16 : q;
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_loadd(4, a + size_t(64) * n, kTileK);  // quad n is k 4n: tile 4n / 64, 1 KB a tile
      _tile_dpbusd(2, 5, 6);
      _tile_loadd(6, bh + size_t(n) * kRowBytes, kRowBytes);
      _tile_dpbusd(3, 5, 7);
      _tile_loadd(5, a + size_t(64) * n + size_t(16) * Kp, kTileK);
      _tile_loadd(7, bh + size_t(n) * kRowBytes + 64, kRowBytes);
      for (size_t o = 0; o < per_step && pf < pf_end; o += 64, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    }
    _tile_stored(0, c, kNR * 4);
    _tile_stored(1, c + 16, kNR * 4);
    _tile_stored(2, c + 16 * kNR, kNR * 4);
    _tile_stored(3, c + 16 * kNR + 16, kNR * 4);
  }
}

// The quads past the last group of 16 of a span-panel (quads q0 .. q1, at most 15), added to part in int32.
void tail(const int8_t* b, int q0, int q1, const uint8_t* xs, int Kp, int M, int kx0, int32_t* part) {
  for (int m = 0; m < M; ++m) {
    int32_t* acc = part + size_t(m) * kNR;
    for (int q = q0; q < q1; ++q)
      for (int e = 0; e < 4; ++e) {
        const int32_t xv = xs[xs_index(m, kx0 + 4 * (q - q0) + e, Kp)];
        const int8_t* w = b + size_t(q) * kRowBytes + e;
        for (int j = 0; j < kNR; ++j) acc[j] += xv * int32_t(w[4 * j]);
      }
  }
}

// x [M, ldx] into the scratch's A tiles, zero-padded to M32 rows and Kp columns: one masked 64-byte load and
// store per tile row (a memcpy and a memset per tile row took a tenth of the warm timing slice's time).
void copy_x(const uint8_t* x, int M, int ldx, int K, int M32, int Kp, uint8_t* xs) {
  for (int m = 0; m < M32; ++m)
    for (int k = 0; k < Kp; k += kTileK) {
      const int n = m < M ? imin(kTileK, K - k) : 0;
      const __mmask64 mask = n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
      const __m512i v = n > 0 ? _mm512_maskz_loadu_epi8(mask, x + size_t(m) * ldx + k) : _mm512_setzero_si512();
      _mm512_storeu_si512(xs + xs_index(m, k, Kp), v);
    }
}

// One panel's int32 sums into y: minus 128 x the column sums, rounded once to fp32.
void finish(const int32_t* part, const int32_t* colsum, int M, int cols, float* y, int ldy) {
  __m512i corr[4];
  __mmask16 mask[4];
  for (int j = 0; j < 4; ++j) {
    const int c = imin(16, cols - 16 * j);
    mask[j] = c <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << c) - 1);
    corr[j] = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask[j], colsum + 16 * j), 7);
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j) {
      const __m512i s = _mm512_loadu_si512(part + size_t(m) * kNR + 16 * j);
      _mm512_mask_storeu_ps(y + size_t(m) * ldy + 16 * j, mask[j], _mm512_cvtepi32_ps(_mm512_sub_epi32(s, corr[j])));
    }
}

// Panels p0 .. p0 + g - 1, all of K: per span, per chunk of k, each panel of the group in turn (its int32 sums in
// its own part of the scratch), then each panel's sums into y.
__attribute__((target("amx-tile,amx-int8"))) void run_group(const int8_t* w, const int32_t* colsum, int K, int N,
                                                            int panels, int p0, int g, const Scratch& s, int Kp, int M,
                                                            int M32, bool rows_outer, const char* end, float* y,
                                                            int ldy) {
  for (int k0 = 0; k0 < K; k0 += kDotKSpan) {
    const int ks = imin(kDotKSpan, K - k0), quads = (ks + 3) / 4, whole = quads / 16 * 16;
    // Chunk q (quads from q) of panel p in this span.
    auto at = [&](int p, int q) {
      return reinterpret_cast<const char*>(w) + size_t(k0) * panels * kNR + (size_t(p) * quads + q) * kRowBytes;
    };
    for (int q = 0; q < whole; q += kChunkQuads) {
      const int n = imin(kChunkQuads, whole - q);
      for (int j = 0; j < g; ++j) {
        const int p = p0 + j;
        // The next chunk this loop runs (that of the next panel of the group, else the group's next k), or at the
        // group's last chunk what follows in memory.
        const char* pf = j + 1 < g ? at(p + 1, q) : q + n < whole ? at(p0, q + n) : at(p, q + n);
        const char* pf_end = pf + size_t(kChunkQuads) * kRowBytes < end ? pf + size_t(kChunkQuads) * kRowBytes : end;
        chunk(at(p, q), n, s.xs, Kp, M32, k0 + 4 * q, s.part + size_t(j) * M32 * kNR, k0 == 0 && q == 0, rows_outer,
              pf, pf_end);
      }
    }
    if (whole < quads)
      for (int j = 0; j < g; ++j) {
        int32_t* part = s.part + size_t(j) * M32 * kNR;
        if (k0 == 0 && whole == 0) std::memset(part, 0, size_t(M32) * kNR * 4);
        tail(reinterpret_cast<const int8_t*>(at(p0 + j, 0)), whole, quads, s.xs, Kp, M, k0 + 4 * whole, part);
      }
  }
  for (int j = 0; j < g; ++j) {
    const int p = p0 + j;
    finish(s.part + size_t(j) * M32 * kNR, colsum + size_t(p) * kNR, M, imin(kNR, N - p * kNR), y + size_t(p) * kNR,
           ldy);
  }
}

}  // namespace

size_t amx_int8_matmul_scratch_bytes(int M, int K) {
  const size_t M32 = (size_t(M > 0 ? M : 0) + 31) / 32 * 32, Kp = (size_t(K > 0 ? K : 0) + 63) / 64 * 64;
  return (M32 * Kp + 63) / 64 * 64 + M32 * kNR * 4 * blocking(int(M32)).group_panels + 64;
}

__attribute__((target("amx-tile,amx-int8"))) void amx_matmul_s8(const int8_t* w, const int32_t* colsum, int K, int N,
                                                                 const uint8_t* x, int M, int ldx, float* y, int ldy,
                                                                 void* scratch, bool x_ready) {
  if (M <= 0 || N <= 0) return;
  const int M32 = (M + 31) / 32 * 32, Kp = (K + kTileK - 1) / kTileK * kTileK;
  const Scratch s = carve(scratch, M32, Kp);
  if (!x_ready) copy_x(x, M, ldx, K, M32, Kp, s.xs);
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {  // every tile 16 rows of 64 bytes: int32 sums, A (64 u8), B (16 columns x 4 s8)
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only: without this the stores to the other
  // 56 bytes of cfg may be dropped (a palette of zeros: every tile instruction then faults).
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
  const int panels = (N + kNR - 1) / kNR;
  const Blocking bl = blocking(M32);
  const char* end = reinterpret_cast<const char*>(w) + size_t(panels) * ((K + 3) / 4) * kRowBytes;
  for (int p0 = 0; p0 < panels; p0 += bl.group_panels)
    run_group(w, colsum, K, N, panels, p0, imin(bl.group_panels, panels - p0), s, Kp, M, M32, bl.rows_outer, end,
              y, ldy);
  _tile_release();
}

}  // namespace alpamayo::cpu
