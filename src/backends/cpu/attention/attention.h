// Flash-style GQA attention for the expert's shape. For one sample b and KV head g, the group*T query
// rows (all query heads sharing g, all tokens) attend to the virtual key sequence
// [prompt cache rows] ++ [suffix rows] ++ [own rows 0..T), processed in blocks of kKeyBlock keys with an
// online softmax (base-2, fp32), so no S x R score matrix exists. A chunk [j0, j1) of that sequence yields
// an unnormalised partial (O, m, l); chunks of one (b, g) are merged by log-sum-exp. Samples that share a
// prompt attend to its rows together (cascade): one item's query rows are all those samples' rows, so
// the prompt is read once; its partial rows are merged with each sample's suffix-and-own partial.
//
// Kernels (AttnKernel, chosen at run time: select_attention_kernel): avx512_bf16 (vdpbf16ps on bf16 pairs, bf16
// probabilities), avx512_fma and avx2_fma (q, k, v widened to fp32 in scratch, fp32 FMAs, fp32 probabilities)
// and portable (plain C++, one key at a time). amx_bf16 (where the OS grants the AMX tile state) computes both
// products of a block on tiles (tdpbf16ps) with bf16 probabilities, the softmax in AVX-512; it reads bf16 caches and
// int8 ones (dequantised to bf16 per block). All compute the same partials: base-2 online softmax, fp32
// accumulation; they differ only in rounding.
//
// An int8 cache (kv int8, src/backends/kv_int8.h) holds every key and value row as int8 with one fp32 scale per
// row. avx512_vnni multiplies it directly with vpdpbusd: the queries are rounded to int8 per row once per chunk,
// the probabilities (times the value rows' scales) to u8 per row and block, and the int32 sums scaled back to
// fp32. The fp32 kernels and the portable one widen the int8 rows (q * s) instead of bf16 ones; avx512_bf16 reads
// bf16 caches only, avx512_vnni int8 caches only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/runtime/aligned.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

constexpr int kKeyBlock = 128;  // keys per online-softmax block (scratch stays in L1/L2)
// amx_bf16's block: twice as many keys halve its per-block round trips of O through the tiles and its per-row
// reductions (its scores and probabilities are per 32-row group, so they grow with the block, not with R).
constexpr int kAmxKeyBlock = 2 * kKeyBlock;
// 4-byte elements added to the row strides of amx_bf16's packed keys, scores and values (bf16 probabilities: twice
// as many), so that rows 1 KB or 512 B apart do not share a few L1 sets.
constexpr int kAmxPad = 16;
// amx_bf16's row group: the rows whose scores and probabilities are held at once (a multiple of 32, the tiles'
// rows). Taller groups read a block's packed keys and values from L2 fewer times, but their scores no longer stay
// in L1: 64 measured slower (docs/PERFORMANCE.md, "AMX attention").
constexpr int kAmxRowGroup = 32;
// Floats added to the row strides of the fp32 kernels' queries, scores and values (AttnScratch qf, s, vf). With
// Rp = 128 or dp = 128 the rows lie 512 B apart, so a column of 128 rows fell into 8 of the 64 L1 sets and was
// evicted while the tiles walked it (docs/PERFORMANCE.md, "Measurements behind design choices").
constexpr int kFmaPad = 16;

struct AttnGeometry {
  int d = 0;    // head dim (even)
  int dp = 0;   // d rounded up to 32 (output columns of O)
  int R = 0;    // query rows per KV head: group * T
  int Rp = 0;   // R rounded up to 16
  int qld = 0;  // leading dimension of the query pairs (>= Rp; several samples' queries side by side)
  float scale_log2 = 0.f;  // log2(e) / sqrt(d)
  static AttnGeometry make(int d, int group, int T);
};

// The bf16 rows of a cache or suffix segment read in place where they are not d apart (a strided view or a page
// pool; kv_row_offset in alpamayo/backend.h): row i of the segment, r = row0 + i, lies at
//   base + r * stride                                                       (pages null)
//   base + pages[r >> page_shift] * page_stride + (r & (2^page_shift - 1)) * stride   (a page table)
struct RowMap {
  const uint16_t* base = nullptr;  // null: the segment's plain pointer in KeyRows (rows d apart)
  int64_t stride = 0;              // elements between rows (of a page)
  const int64_t* pages = nullptr;  // the sequence's page table
  int page_shift = 0;              // log2 of the page size
  int64_t page_stride = 0;         // elements between pages
  int64_t row0 = 0;                // the segment's first row in the sequence (left padding)
};

// Key/value rows of one (b, g): bf16. Key j < S is a cache row, j < S + S2 a middle (suffix) row j - S, else own
// row j - S - S2. Each segment's rows lie d apart from its plain pointer, or where its RowMap says.
struct KeyRows {
  const uint16_t* k_cache = nullptr;  // null where k_map says (then the kernels prefetch no cache rows)
  const uint16_t* v_cache = nullptr;
  int S = 0;
  const uint16_t* k_own = nullptr;
  const uint16_t* v_own = nullptr;
  const uint16_t* k_mid = nullptr;
  const uint16_t* v_mid = nullptr;
  int S2 = 0;
  RowMap k_map, v_map, k_mid_map, v_mid_map;
  // An int8 cache: every row as int8 (keys stored q + 128 as u8, values q as s8) with one fp32 scale per row; the
  // segments cache, mid and own (i8[0..2]) at the same row indices as the bf16 pointers above, then unused.
  struct Int8Segment {
    const uint8_t* k = nullptr;
    const int8_t* v = nullptr;
    const float *ks = nullptr, *vs = nullptr;
  };
  bool int8 = false;
  Int8Segment i8[3];
  // Optional memory the caller needs next (the thread's o_proj weights), prefetched into L2 spread
  // over the chunk's blocks so that it arrives without stalling anyone.
  const char* prefetch = nullptr;
  size_t prefetch_bytes = 0;
};

// Per-thread scratch for one key block.
struct AttnScratch {
  // The fp32 kernels' widened operands: queries [dp][Rp + kFmaPad] (only the chunk's rows), keys [kKeyBlock][d],
  // values [kKeyBlock][dp + kFmaPad]. Empty unless resize(g, true).
  AlignedBuf<float> qf, kf, vf;
  AlignedBuf<const uint16_t*> kptr, vptr;
  AlignedBuf<float> s;       // scores / probabilities [kKeyBlock][Rp] (fp32 kernels: [kKeyBlock][Rp + kFmaPad])
  AlignedBuf<uint32_t> p;    // probability pairs (bf16 x 2) [kKeyBlock/2][Rp]
  AlignedBuf<uint32_t> v;    // value pairs (bf16 x 2) [kKeyBlock/2][dp]
  AlignedBuf<float> alpha;   // per-row rescale of O for the current block [Rp]
  AlignedBuf<float> lblk;    // per-row probability sums of the current block [Rp]
  AlignedBuf<uint16_t> zero; // a zero key/value row [dp]
  // An int8 cache's rows and scales per key of the block; avx512_vnni's int8 queries [dp/4][Rp] (4 per word),
  // their per-row scales and int32 corrections, and the per-row maxima of a block's probabilities. Empty unless
  // resize(g, ..., true).
  AlignedBuf<const uint8_t*> k8ptr;
  AlignedBuf<const int8_t*> v8ptr;
  AlignedBuf<float> kscale, vscale, qscale, pmax;
  AlignedBuf<uint32_t> q8;
  AlignedBuf<int32_t> qcorr;
  // amx_bf16's queries row-major [Rp][dp] (bf16) and a block's keys as pairs [dp/2][kAmxKeyBlock + kAmxPad]; it
  // uses s as a row group's scores [kAmxRowGroup][kAmxKeyBlock + kAmxPad], p as their probabilities (bf16)
  // [kAmxRowGroup][kAmxKeyBlock + 2 kAmxPad], v as the value pairs [kAmxKeyBlock/2][dp + kAmxPad], and kptr, vptr
  // (and the int8 arrays) for kAmxKeyBlock keys. Empty unless resize(g, ..., ..., true).
  AlignedBuf<uint16_t> qa;
  AlignedBuf<uint32_t> kb;
  void resize(const AttnGeometry& g, bool fp32 = false, bool int8 = false, bool amx = false);
  size_t bytes() const {
    size_t n = 0;
    for (size_t b : {qf.bytes(), kf.bytes(), vf.bytes(), kptr.bytes(), vptr.bytes(), s.bytes(), p.bytes(), v.bytes(),
                     alpha.bytes(), lblk.bytes(), zero.bytes(), k8ptr.bytes(), v8ptr.bytes(), kscale.bytes(),
                     vscale.bytes(), qscale.bytes(), pmax.bytes(), q8.bytes(), qcorr.bytes(), qa.bytes(), kb.bytes()})
      n += b;
    return n;
  }
};

// The scratch as plain pointers, for the ISA translation units (which must call no inline function of a
// header: an out-of-line copy compiled for their ISA could be the one the linker keeps for everyone).
struct AttnWork {
  const uint16_t** kptr;
  const uint16_t** vptr;
  float* s;
  uint32_t* p;
  uint32_t* v;
  float* alpha;
  float* lblk;
  const uint16_t* zero;
  float *qf, *kf, *vf;
  const uint8_t** k8ptr;
  const int8_t** v8ptr;
  float *kscale, *vscale, *qscale, *pmax;
  uint32_t* q8;
  int32_t* qcorr;
  uint16_t* qa;
  uint32_t* kb;
};

enum class AttnKernel { Avx512Bf16, Avx512Vnni, Avx512Fma, Avx2Fma, AmxBf16, Portable };
// In timing order (isa.h, kChoiceMargin): amx_bf16 after the AVX kernels, so that it is taken only where it is
// clearly faster.
inline constexpr AttnKernel kAttnKernels[] = {AttnKernel::Avx512Bf16, AttnKernel::Avx512Vnni, AttnKernel::Avx512Fma,
                                              AttnKernel::Avx2Fma,    AttnKernel::AmxBf16,    AttnKernel::Portable};
// "avx512_bf16", "avx512_vnni", "avx512_fma", "avx2_fma", "amx_bf16", "portable"
const char* attn_kernel_name(AttnKernel k);
const char* attn_kernel_instruction(AttnKernel k);  // what does the multiply-adds: "vdpbf16ps zmm", ...
// Empty when the kernel can run within `i` (isa(), or a model's cap: isa_with_cap) on a bf16 cache (int8 = false)
// or an int8 one, else why not ("needs avx512_bf16", "reads only int8 caches (kv int8)").
std::string attn_kernel_unavailable(AttnKernel k, bool int8 = false, const IsaInfo& i = isa());
// The kernel by name; throws alpamayo::Error naming the candidates for an unknown one or one that cannot run.
AttnKernel attn_kernel_from_name(const std::string& name, const std::string& what, bool int8 = false,
                                 const IsaInfo& i = isa());

// The kernel for the model's attention shape (head dim d, group * T query rows per KV head) and cache (bf16 or
// int8) within scope.isa: the one scope.kernels forces (attention=NAME, attention_kv_int8=NAME; forced_kernel(),
// isa.h), else the fastest runnable one, timed once per process, shape, cache and instruction sets on `keys`
// random keys (about 0.1 s in all), of those that pass the accuracy check on the same data (kernel_check.h); a forced
// one that fails it is an alpamayo::Error. The choice is added to *made (isa.h, record_kernel_choice) if given.
AttnKernel select_attention_kernel(int d, int group, int T, int keys, bool int8, const KernelScope& scope,
                                   KernelChoices* made);
// GFLOP/s of one kernel on one thread for that shape (4 * R * keys * d flops per run): for the benchmarks.
double time_attention_kernel(AttnKernel k, int d, int group, int T, int keys, double min_seconds, bool int8 = false);

// Queries of one (b, g) as bf16 pairs: qp[i * qld + r] holds (q[r][2i], q[r][2i+1]); rows >= R zero.
// O [Rp][dp], m, l [Rp] hold the running partial; init_partial() sets the empty state.
void init_partial(const AttnGeometry& g, float* O, float* m, float* l);
// The chunk [j0, j1) of kv, added to the partial (O, m, l). The scratch must have been resized for g (with
// fp32 = true for the fp32 kernels); the kernel must be runnable here (attn_kernel_unavailable).
void attend_chunk(AttnKernel kernel, const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                  float* O, float* m, float* l, AttnScratch& scratch);
bool attn_kernel_is_fp32(AttnKernel k);
bool attn_kernel_is_amx(AttnKernel k);  // needs the scratch's amx buffers (AttnScratch::resize)
void attend_chunk_portable(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                           float* O, float* m, float* l);
// The ISA kernels (attention_avx512.cpp, attention_avx512_fma.cpp, attention_avx2.cpp, attention_avx512_vnni.cpp,
// attention_avx512_amx.cpp).
void attend_chunk_avx512bf16(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                             float* O, float* m, float* l, const AttnWork& w);
void attend_chunk_avx512fma(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                            float* O, float* m, float* l, const AttnWork& w);
void attend_chunk_avx2fma(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O,
                          float* m, float* l, const AttnWork& w);
void attend_chunk_avx512vnni(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1,
                             float* O, float* m, float* l, const AttnWork& w);
void attend_chunk_amx(const AttnGeometry& g, const uint32_t* qp, const KeyRows& kv, int j0, int j1, float* O,
                      float* m, float* l, const AttnWork& w);

// An int8 cache's rows for the kernels (cpu backend, benchmarks, tests): one row x [d] quantised per
// kv_int8.h, the key stored as q + 128 (u8), the value as q (s8). Returns the row's scale.
float store_int8_key_row(const float* x, int d, uint8_t* k8);
float store_int8_value_row(const float* x, int d, int8_t* v8);
// `rows` bf16 key and value rows of d as an int8 cache's rows and scales (benchmarks, kernel timing).
void store_int8_rows(const uint16_t* k, const uint16_t* v, size_t rows, int d, uint8_t* k8, int8_t* v8, float* ks,
                     float* vs);

// The one place a key index becomes a bf16 row pointer: kptr[k], vptr[k] for keys jb + k, k < n, of kv, and `zero`
// for k in [n, npad). Out of line, so that the ISA translation units share it (AttnWork's comment says why).
void key_row_ptrs(const KeyRows& kv, int d, int jb, int n, int npad, const uint16_t* zero, const uint16_t** kptr,
                  const uint16_t** vptr);

// Merges n partials (O, m, l at stride Rp*dp / Rp) and writes query row r = hh*T + t (hh < group) of
// head g*group + hh to out[t * ld + (g*group + hh) * d + c], as fp32 and/or bf16 (either may be null).
void merge_partials(const AttnGeometry& g, int n, const float* O, const float* m, const float* l, int T,
                    int group, int head0, int ld, float* out_f32, uint16_t* out_bf16);
// The same over partials anywhere: O[c] [Rp][dp], m[c], l[c] [Rp].
void merge_partials(const AttnGeometry& g, int n, const float* const* O, const float* const* m,
                    const float* const* l, int T, int group, int head0, int ld, float* out_f32, uint16_t* out_bf16);

bool cpu_has_avx512_bf16();

}  // namespace alpamayo::cpu
