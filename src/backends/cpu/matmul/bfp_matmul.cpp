#include "backends/cpu/matmul/bfp_matmul.h"

#include <algorithm>
#include <cstring>

#include "alpamayo/error.h"
#include "alpamayo/tensor.h"
#include "backends/cpu/attention/attention.h"

namespace alpamayo::cpu {
namespace {

bfp::Format bfp_format(BlockStore s) { return s == BlockStore::BFP8_B ? bfp::Format::Bfp8_b : bfp::Format::Bfp4_b; }

int panels(int n) { return (n + kPanel - 1) / kPanel; }
// Tile columns of panel p (2, or 1 for a last panel of at most 32 columns).
int panel_tiles(int n, int p) { return std::min(kPanel, n - p * kPanel) > 32 ? 2 : 1; }

// Decodes tile rows [tr0, tr0 + ntr) of panel p into wf[k][kPanel] fp32 (k relative to 32 * tr0; columns past
// the panel's tiles are left as they are).
void decode_fp32(const BlockWeights& w, int p, int tr0, int ntr, float* wf) {
  const int tiles = panel_tiles(w.N(), p);
  const uint8_t* base = w.data() + w.panel_offset(p);
  if (w.store() == BlockStore::BF16) {
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(base);
    const int ldw = tiles * 32;
    for (int kp = tr0 * 16; kp < (tr0 + ntr) * 16; ++kp)
      for (int c = 0; c < ldw; ++c) {
        const uint32_t v = pairs[size_t(kp) * ldw + c];
        const int k = 2 * (kp - tr0 * 16);
        wf[size_t(k) * kPanel + c] = bf16_to_f32(static_cast<uint16_t>(v & 0xffff));
        wf[size_t(k + 1) * kPanel + c] = bf16_to_f32(static_cast<uint16_t>(v >> 16));
      }
    return;
  }
  const bfp::Format f = bfp_format(w.store());
  const size_t tb = bfp::tile_bytes(f);
  for (int tr = tr0; tr < tr0 + ntr; ++tr)
    for (int j = 0; j < tiles; ++j)
      bfp::dequantize_tile(f, base + (size_t(tr) * tiles + j) * tb, wf + size_t(tr - tr0) * 32 * kPanel + j * 32,
                           kPanel);
}

void block_matmul_portable(const BlockWeights& w, const uint16_t* x, int M, int ldx, float* y, int ldy,
                           void* scratch) {
  float* wf = static_cast<float*>(scratch);
  const int K = w.K(), n = w.N(), TR = w.tile_rows();
  for (int p = 0; p < panels(n); ++p) {
    const int c0 = p * kPanel, nc = std::min(kPanel, n - c0);
    for (int tr0 = 0; tr0 < TR; tr0 += kKBlock / 32) {
      const int ntr = std::min(kKBlock / 32, TR - tr0), k0 = tr0 * 32, kv = std::min(K - k0, ntr * 32);
      decode_fp32(w, p, tr0, ntr, wf);
      // Register tiles of 4 rows x 16 columns (fixed sizes the compiler keeps in vector registers).
      for (int m0 = 0; m0 < M; m0 += 4) {
        const int mr = std::min(4, M - m0);
        for (int j0 = 0; j0 < nc; j0 += 16) {
          const int jn = std::min(16, nc - j0);
          float acc[4][16] = {};
          if (k0)
            for (int r = 0; r < mr; ++r)
              for (int j = 0; j < jn; ++j) acc[r][j] = y[size_t(m0 + r) * ldy + c0 + j0 + j];
          const uint16_t* xr[4];
          for (int r = 0; r < 4; ++r) xr[r] = x + size_t(m0 + std::min(r, mr - 1)) * ldx + k0;
          for (int k = 0; k < kv; ++k) {
            const float* wr = wf + size_t(k) * kPanel + j0;
            for (int r = 0; r < 4; ++r) {
              const float xv = bf16_to_f32(xr[r][k]);
#pragma omp simd
              for (int j = 0; j < 16; ++j) acc[r][j] += xv * wr[j];
            }
          }
          for (int r = 0; r < mr; ++r)
            for (int j = 0; j < jn; ++j) y[size_t(m0 + r) * ldy + c0 + j0 + j] = acc[r][j];
        }
      }
    }
  }
}

}  // namespace

size_t BlockWeights::panel_offset(int p) const {
  // Every panel before the last has two tile columns.
  if (store_ == BlockStore::BF16) return size_t(p) * tile_rows() * 16 * kPanel * 4;
  return size_t(p) * tile_rows() * 2 * bfp::tile_bytes(bfp_format(store_));
}

void BlockWeights::pack(BlockStore s, const float* W, int K, int n) {
  check(K > 0 && n > 0, "block weights: empty matrix");
  store_ = s;
  K_ = K;
  N_ = n;
  const int P = panels(n), TR = tile_rows();
  bytes_ = panel_offset(P - 1);
  const int last_tiles = panel_tiles(n, P - 1);
  bytes_ += s == BlockStore::BF16 ? size_t(TR) * 16 * last_tiles * 32 * 4
                                  : size_t(TR) * last_tiles * bfp::tile_bytes(bfp_format(s));
  auto buf = std::make_shared<HugeBuf>(bytes_);
  uint8_t* out = static_cast<uint8_t*>(buf->data());
  auto w = [&](int c, int k) { return c < n && k < K ? W[size_t(c) * K + k] : 0.f; };
  for (int p = 0; p < P; ++p) {
    const int tiles = panel_tiles(n, p), c0 = p * kPanel;
    uint8_t* base = out + panel_offset(p);
    if (s == BlockStore::BF16) {
      uint32_t* pairs = reinterpret_cast<uint32_t*>(base);
      const int ldw = tiles * 32;
      for (int kp = 0; kp < TR * 16; ++kp)
        for (int c = 0; c < ldw; ++c)
          pairs[size_t(kp) * ldw + c] = uint32_t(f32_to_bf16(w(c0 + c, 2 * kp))) |
                                        uint32_t(f32_to_bf16(w(c0 + c, 2 * kp + 1))) << 16;
      continue;
    }
    const bfp::Format f = bfp_format(s);
    alignas(64) float tile[32 * 32];
    for (int tr = 0; tr < TR; ++tr)
      for (int j = 0; j < tiles; ++j) {
        for (int i = 0; i < 32; ++i)  // tile row i = K index tr*32 + i, columns = output features
          for (int jj = 0; jj < 32; ++jj) tile[i * 32 + jj] = w(c0 + j * 32 + jj, tr * 32 + i);
        bfp::pack_tiles(f, tile, 1, true, base + (size_t(tr) * tiles + j) * bfp::tile_bytes(f));
      }
  }
  buf_ = std::move(buf);
}

std::vector<float> BlockWeights::dequantize() const {
  std::vector<float> out(size_t(N_) * K_);
  std::vector<float> wf(size_t(tile_rows()) * 32 * kPanel);
  for (int p = 0; p < panels(N_); ++p) {
    decode_fp32(*this, p, 0, tile_rows(), wf.data());
    for (int c = p * kPanel; c < std::min(N_, (p + 1) * kPanel); ++c)
      for (int k = 0; k < K_; ++k) out[size_t(c) * K_ + k] = wf[size_t(k) * kPanel + c - p * kPanel];
  }
  return out;
}

int BlockLinear::N() const {
  int n = 0;
  for (const BlockWeights& w : parts) n += w.N();
  return n;
}

size_t BlockLinear::bytes() const {
  size_t n = 0;
  for (const BlockWeights& w : parts) n += w.bytes();
  return n;
}

bool block_kernel_avx512_available() { return cpu_has_avx512_bf16(); }

size_t block_scratch_bytes() { return size_t(kKBlock) * kPanel * sizeof(float); }

void block_matmul(BlockKernel kernel, const BlockWeights& w, const uint16_t* x, int M, int ldx, float* y, int ldy,
                  void* scratch) {
  if (M <= 0 || w.N() == 0) return;
  if (kernel == BlockKernel::Avx512Bf16)
    block_matmul_avx512({w.data(), w.store(), w.K(), w.N(), w.tile_rows(), w.panel_offset(1)}, x, M, ldx, y, ldy,
                        scratch);
  else
    block_matmul_portable(w, x, M, ldx, y, ldy, scratch);
}

void block_matmul(BlockKernel kernel, const BlockLinear& lin, const uint16_t* x, int M, int ldx, float* y, int ldy,
                  void* scratch) {
  int c0 = 0;
  for (const BlockWeights& w : lin.parts) {
    block_matmul(kernel, w, x, M, ldx, y + c0, ldy, scratch);
    c0 += w.N();
  }
}

}  // namespace alpamayo::cpu
