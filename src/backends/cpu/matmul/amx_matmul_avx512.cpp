// "amx_bf16" of matmul_kernels.h: bf16 weights on AMX tiles (tdpbf16ps), compiled with the AVX-512 flags
// (CMakeLists.txt) and the AMX ones per function; called only where isa() grants AMX-BF16 (the OS permission
// included, isa.cpp).
//
// Why: at the seed's 64 rows a step makes one pass over the weights and AMX multiplies them several times
// faster than they arrive from memory, so the matmul phases are bound by the read bandwidth alone if the
// weights stream without pause. oneDNN's AMX brgemm reached about half of it (docs/PERFORMANCE.md,
// "Roofline"), leaving the streaming to the hardware prefetchers.
//
// Layout: avx512_bf16's (MatmulWeights::pack*): panels of 64 columns, K in spans of kDotKSpan, rows in pairs of
// k, [ks/2][64][2] bf16 per span-panel: 256 bytes a packed row, so the B tile of 16 columns x 16 pairs is
// 16 rows of 64 bytes at a stride of 256 bytes, read in place.
// Loop: per group of panels (one panel below kManyRows rows, kGroupPanels from there: blocking() below), per
// chunk of kChunkPairs pairs (128 KB of a panel's weights: stays in L2 with x's chunk and the next chunk; at many
// rows the whole span where all rows' x of it fits kOneChunkX, so that no partial sums go through memory), per
// panel of the group, per half panel (32 columns) and 32-row block (in the order blocking() says), the 2 x 2
// tiles of fp32 accumulators (tmm0-3) run over the chunk with 2 A tiles (x, tmm4-5) and 2 B tiles (tmm6-7).
// Partial sums go to an fp32 buffer per panel between chunks, the last chunk's whole row blocks straight to y
// (exactly: the sums are those of one unbroken chain of tdpbf16ps in k order, whatever M, N, the slice or the
// blocking). Meanwhile the next chunk the loop runs is prefetched into L2, a few lines per k step, spread
// evenly over the chunk's work: so DRAM streams during all of the compute, not only during the first row
// block's loads. K beyond the last whole group of 16 pairs (K not a multiple of 32) is added after the tiles,
// in fp32. Several matrices of the same K (amx_matmul_bf16_parts: a thread's column chunks) run as one sequence
// of panels, so a group may span two of them.
//
// Nothing here may instantiate an inline or template function with external linkage (scripts/check-isa-objects.sh).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/matmul/matmul_kernels.h"

namespace alpamayo::cpu {
namespace {

constexpr int kNR = 64;             // columns per panel
constexpr int kChunkPairs = 512;    // k pairs per chunk: 512 x 256 bytes = 128 KB of one panel's weights
constexpr int kRowBytes = kNR * 4;  // one packed row: 64 columns x a pair of bf16
static_assert(kDotKSpan % (2 * kChunkPairs) == 0, "chunks must not straddle spans");
// At many rows, a span whose x (all rows) takes at most this many bytes runs as one chunk: no partial sums between
// chunks, every 32 x 32 block's sums stay in the tiles over all of its k and go straight to y. Beyond it x no
// longer stays in L2 beside the weights (docs/PERFORMANCE.md, "AMX, seventh pass").
constexpr size_t kOneChunkX = 1280 * 1024;

// At many rows the matmul is bound by arithmetic, and the tile loads' source sets its rate (docs/PERFORMANCE.md,
// "AMX bf16 matmul at many rows"): there the loop runs a group of panels per chunk of k, so that the chunk's x
// (all rows) is read from L2 by each panel of the group instead of from L3 by every panel when x outgrows L2,
// and each row block's two half panels back to back (its x stays in L1/L2 between them). At few rows the
// weights stream from memory: one panel at a time, half panels outer (a half panel's chunk cached for the
// row blocks), the prefetch a chunk ahead in memory order.
constexpr int kManyRows = kAmxManyRows;
constexpr int kGroupPanels = 4;  // with kChunkPairs: 768 KB of x and 384 KB of sums at 384 rows, in L2
struct Blocking {
  int group_panels;
  bool rows_outer;
};
Blocking blocking(int M32) { return M32 < kManyRows ? Blocking{1, false} : Blocking{kGroupPanels, true}; }

__attribute__((always_inline)) inline int imin(int a, int b) { return a < b ? a : b; }

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

float bf16_value(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The scratch: x as bf16, K rounded up to Kp (a multiple of 32) and M to M32 rows, zero-padded, in A tiles: for
// each 16 rows, for each 32 k, the tile's 16 x 32 bf16 contiguous (1 KB, rows of 64 bytes). Then the fp32 partial
// sums of one panel [M32][64]. Why tiles and not rows: rows of Kp at a stride of a multiple of 4 KB put a tile's 16
// rows in one L1 set and on 16 pages; contiguous tiles ran the loop 12-20% faster with the weights in cache
// (docs/PERFORMANCE.md).
constexpr int kTileBytes = 64;  // the A tile's row stride: 32 bf16

// Where x's element (m, k) sits in the scratch (above): a pair (k, k + 1), k even, stays side by side.
size_t xs_index(int m, int k, int Kp) { return (size_t(m / 16) * (Kp / 32) + k / 32) * 512 + (m % 16) * 32 + k % 32; }
struct Scratch {
  uint16_t* xs;
  float* part;
};
Scratch carve(void* scratch, int M32, int Kp) {
  char* p = static_cast<char*>(scratch);
  const size_t xs_bytes = (size_t(M32) * Kp * 2 + 63) / 64 * 64;
  return {reinterpret_cast<uint16_t*>(p), reinterpret_cast<float*>(p + xs_bytes)};
}

// Where a chunk's sums go: part (fp32 [M32][64]), except that the panel's last chunk stores its first `rows`
// rows (whole 32-row blocks of a full panel) straight into y at stride ldy: the copy of part into y went
// through a separate pass over y otherwise, a large share of the time at many rows (docs/PERFORMANCE.md).
struct Sink {
  float* part;
  float* y;
  int ldy, rows;
};

// One span-panel's chunk of `pairs` (a multiple of 16) k pairs starting at pair q0 of the span: every 32-row
// block and both half panels, accumulating into out (first: start from zero). Prefetches [pf, pf_end) spread
// over its k steps.
__attribute__((target("amx-tile,amx-bf16"))) void chunk(const char* b, int pairs, const uint16_t* xs, int Kp, int M32,
                                                        int kx0, Sink out, bool first, bool rows_outer,
                                                        const char* pf, const char* pf_end) {
  float* const part = out.part;
  const int blocks = M32 / 32, steps = pairs / 16 * 2 * blocks;
  const size_t pf_total = pf < pf_end ? size_t(pf_end - pf) : 0;
  const size_t per_step = (pf_total / (steps > 0 ? steps : 1) + 63) / 64 * 64;
  // Half panels outer: a half panel's weights of the chunk stay cached for all row blocks. Row blocks outer:
  // both halves of one row block back to back, so its x (32 rows of the chunk) stays in L1/L2 between them and
  // the chunk's working set is that block's x and the chunk's weights instead of all rows' x.
  for (int i = 0; i < 2 * blocks; ++i) {
    const int h = rows_outer ? i % 2 : i / blocks, r = 32 * (rows_outer ? i / 2 : i % blocks);
    float* c = part + size_t(r) * kNR + h * 32;
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
    const uint16_t* a = xs + xs_index(r, kx0, Kp);
    const char* bh = b + h * 128;
    // Each operand tile is loaded again for the next step as soon as its last product of this step has been
    // issued: the tiles are not renamed, so a load waits for the products reading the tile it overwrites.
    _tile_loadd(4, a, kTileBytes);
    _tile_loadd(6, bh, kRowBytes);
    _tile_loadd(5, a + size_t(16) * Kp, kTileBytes);
    _tile_loadd(7, bh + 64, kRowBytes);
    for (int q = 0; q < pairs; q += 16) {
      // The last step loads its own tiles again (in bounds, unused): fewer branches in the loop.
      const int n = q + 16 < pairs ? q + 16 : q;
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(4, a + size_t(32) * n, kTileBytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(6, bh + size_t(n) * kRowBytes, kRowBytes);
      _tile_dpbf16ps(3, 5, 7);
      _tile_loadd(5, a + size_t(32) * n + size_t(16) * Kp, kTileBytes);
      _tile_loadd(7, bh + size_t(n) * kRowBytes + 64, kRowBytes);
      for (size_t o = 0; o < per_step && pf < pf_end; o += 64, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    }
    int ld = kNR;
    if (r < out.rows) {
      c = out.y + size_t(r) * out.ldy + h * 32;
      ld = out.ldy;
    }
    _tile_stored(0, c, ld * 4);
    _tile_stored(1, c + 16, ld * 4);
    _tile_stored(2, c + size_t(16) * ld, ld * 4);
    _tile_stored(3, c + size_t(16) * ld + 16, ld * 4);
  }
}

// The pairs past the last group of 16 of a span-panel (pairs q0 .. q1), added to part in fp32, pair by pair.
void tail(const uint16_t* b, int q0, int q1, const uint16_t* xs, int Kp, int M, int kx0, float* part) {
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < kNR; ++j) {
      float acc = part[size_t(m) * kNR + j];
      for (int q = q0; q < q1; ++q) {
        const uint16_t* w = b + size_t(q) * kNR * 2 + j * 2;
        const uint16_t* xv = xs + xs_index(m, kx0 + 2 * (q - q0), Kp);
        acc += bf16_value(xv[0]) * bf16_value(w[0]) + bf16_value(xv[1]) * bf16_value(w[1]);
      }
      part[size_t(m) * kNR + j] = acc;
    }
}

}  // namespace

int amx_matmul_chunk_pairs(int M, int ks) {
  const int M32 = (M + 31) / 32 * 32, whole = (ks + 1) / 2 / 16 * 16;
  return blocking(M32).rows_outer && size_t(M32) * ks * 2 <= kOneChunkX && whole > 0 ? whole : kChunkPairs;
}

size_t amx_matmul_scratch_bytes(int M, int K) {
  const size_t M32 = (size_t(M > 0 ? M : 0) + 31) / 32 * 32, Kp = (size_t(K > 0 ? K : 0) + 31) / 32 * 32;
  return (M32 * Kp * 2 + 63) / 64 * 64 + M32 * kNR * 4 * blocking(int(M32)).group_panels + 64;
}

namespace {

// Panel i of the parts' panels in order (part by part): its weights, columns and output.
struct PanelRef {
  const char* w;  // the part's packed weights
  int panels;     // the part's panel count (the packed layout's stride between spans)
  int p;          // the panel within the part
  int cols;       // columns of this panel (kNR but at the part's last panel)
  float* y;       // its first column in the part's output
  int ldy;
  const char* end;  // the end of the part's packed weights (prefetch bound)
};

PanelRef panel_ref(const AmxBf16Part* parts, int nparts, int i, int K) {
  for (int j = 0; j < nparts; ++j) {
    const int panels = (parts[j].N + kNR - 1) / kNR;
    if (i < panels) {
      const char* w = reinterpret_cast<const char*>(parts[j].w);
      return {w, panels, i, imin(kNR, parts[j].N - i * kNR), parts[j].y + size_t(i) * kNR, parts[j].ldy,
              w + size_t(panels) * ((K + 1) / 2) * kRowBytes};
    }
    i -= panels;
  }
  return {};
}

// Chunk q (pairs from q) of panel r in the span at k0 of `pairs` pairs.
const char* at(const PanelRef& r, int k0, int pairs, int q) {
  return r.w + size_t(k0) * r.panels * kNR * 2 + (size_t(r.p) * pairs + q) * kRowBytes;
}

void prepare_x(const uint16_t* x, int M, int ldx, int K, int M32, int Kp, uint16_t* xs) {
  for (int m = 0; m < M32; ++m)
    for (int k = 0; k < Kp; k += 32) {
      uint16_t* dst = xs + xs_index(m, k, Kp);
      const int n = m < M ? imin(32, K - k) : 0;
      if (n > 0) std::memcpy(dst, x + size_t(m) * ldx + k, size_t(n) * 2);
      std::memset(dst + n, 0, size_t(32 - n) * 2);
    }
}

// What to prefetch while chunk q (n pairs) of group panel j runs: the next chunk the loop runs (that of the next
// panel of the group, else the group's next k), or at the group's last chunk the next group's first panel (one
// span), else what follows in memory; at most one chunk, within that panel's part.
struct Prefetch {
  const char *begin, *end;
};
Prefetch prefetch_range(const PanelRef* g_refs, int g, int j, const PanelRef* next, const PanelRef& r, int k0,
                        int pairs, int q, int n, int whole, bool last_span, int cp) {
  const PanelRef* pr = &r;
  const char* pf;
  if (j + 1 < g) pf = at(*(pr = &g_refs[j + 1]), k0, pairs, q);
  else if (q + n < whole) pf = at(*(pr = &g_refs[0]), k0, pairs, q + n);
  else if (next && k0 == 0 && last_span) pf = at(*(pr = next), 0, pairs, 0);
  else pf = at(r, k0, pairs, q + n);
  const char* end = pf + size_t(cp) * kRowBytes;
  return {pf, end < pr->end ? end : pr->end};
}

// One group of g panels (refs), all of K: per span, per chunk of k, each panel of the group in turn.
__attribute__((target("amx-tile,amx-bf16"))) void run_group(const PanelRef* g_refs, int g, const PanelRef* next,
                                                            const Scratch& s, int K, int Kp, int M, int M32,
                                                            bool rows_outer) {
  int direct[kGroupPanels] = {};  // rows of each panel already in y
  for (int k0 = 0; k0 < K; k0 += kDotKSpan) {
    const int ks = imin(kDotKSpan, K - k0), pairs = (ks + 1) / 2, whole = pairs / 16 * 16;
    const bool last_span = k0 + kDotKSpan >= K;
    const int cp = amx_matmul_chunk_pairs(M32, ks);
    for (int q = 0; q < whole; q += cp) {
      const int n = imin(cp, whole - q);
      for (int j = 0; j < g; ++j) {
        const PanelRef& r = g_refs[j];
        const Prefetch pf = prefetch_range(g_refs, g, j, next, r, k0, pairs, q, n, whole, last_span, cp);
        if (last_span && q + n == pairs && r.cols == kNR) direct[j] = M / 32 * 32;
        chunk(at(r, k0, pairs, q), n, s.xs, Kp, M32, k0 + 2 * q,
              {s.part + size_t(j) * M32 * kNR, r.y, r.ldy, direct[j]},
              k0 == 0 && q == 0, rows_outer, pf.begin, pf.end);
      }
    }
    if (whole < pairs)
      for (int j = 0; j < g; ++j) {
        float* part = s.part + size_t(j) * M32 * kNR;
        if (k0 == 0 && whole == 0) std::memset(part, 0, size_t(M32) * kNR * 4);
        tail(reinterpret_cast<const uint16_t*>(at(g_refs[j], k0, pairs, 0)), whole, pairs, s.xs, Kp, M,
             k0 + 2 * whole, part);
      }
  }
  for (int j = 0; j < g; ++j)
    for (int m = direct[j]; m < M; ++m)
      std::memcpy(g_refs[j].y + size_t(m) * g_refs[j].ldy, s.part + (size_t(j) * M32 + m) * kNR, g_refs[j].cols * 4);
}

}  // namespace

__attribute__((target("amx-tile,amx-bf16"))) void amx_matmul_bf16_parts(const AmxBf16Part* parts, int nparts, int K,
                                                                        const uint16_t* x, int M, int ldx,
                                                                        void* scratch, bool x_ready) {
  int panels = 0;
  for (int j = 0; j < nparts; ++j) panels += (parts[j].N + kNR - 1) / kNR;
  if (M <= 0 || panels == 0) return;
  const int M32 = (M + 31) / 32 * 32, Kp = (K + 31) / 32 * 32;
  const Scratch s = carve(scratch, M32, Kp);
  if (!x_ready) prepare_x(x, M, ldx, K, M32, Kp, s.xs);
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only: without this the stores to the other
  // 56 bytes of cfg may be dropped (a palette of zeros: every tile instruction then faults).
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
  const Blocking bl = blocking(M32);
  // A group may take panels of two parts: the parts' panels are one sequence (each panel's sums are the same).
  for (int p0 = 0; p0 < panels; p0 += bl.group_panels) {
    const int g = imin(bl.group_panels, panels - p0);
    PanelRef refs[kGroupPanels];
    for (int j = 0; j < g; ++j) refs[j] = panel_ref(parts, nparts, p0 + j, K);
    const PanelRef next = p0 + g < panels ? panel_ref(parts, nparts, p0 + g, K) : PanelRef{};
    run_group(refs, g, p0 + g < panels ? &next : nullptr, s, K, Kp, M, M32, bl.rows_outer);
  }
  _tile_release();
}

void amx_matmul_bf16(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                     void* scratch, bool x_ready) {
  if (N <= 0) return;
  const AmxBf16Part part{w, N, y, ldy};
  amx_matmul_bf16_parts(&part, 1, K, x, M, ldx, scratch, x_ready);
}

}  // namespace alpamayo::cpu
