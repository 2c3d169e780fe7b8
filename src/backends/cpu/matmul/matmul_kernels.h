// The cpu backend's own matmul kernels, one table of them (MatmulKernel): y[M, ldy] (first N columns) =
// x[M, K] * W[N, K]^T for bf16 or int8 weights packed once, run on one thread's column slice. Two families:
//  - FMA kernels (avx512_fma, avx2_fma, portable_fma; fma_matmul_avx512.cpp, fma_matmul_avx2.cpp, here): both
//    operands widened to fp32 in registers (exact: a bf16 is the top half of an fp32) and multiplied with
//    `vfmadd231ps`. Why: where `vdpbf16ps` runs at half the rate of fp32 FMA, and where oneDNN 2.6 has no bf16
//    matmul at all (AVX2-only CPUs), they beat oneDNN's bf16 path (docs/CPU_BACKEND.md, "bf16 matmuls on fp32
//    FMAs"; docs/PERFORMANCE.md, "Measurements behind design choices").
//  - dot-product kernels (avx512_vnni, avx512_bf16, avx2_int8; dot_matmul_avx512.cpp, dot_matmul_avx2.cpp),
//    described below.
// The oneDNN path is not in this table: onednn_matmul.h.
//
// Layout: W is packed once (bf16, RNE from fp32) into panels of `matmul_panel_width(kernel)` output columns (64 for
// AVX-512, 16 for AVX2 and the portable kernel), the last one zero-padded, and K into spans of matmul_k_span(kernel)
// rows (the last one shorter): span by span, panel by panel, each [span rows][width]. A kernel walks spans, panels,
// rows in that order, so it streams its weights strictly sequentially while its fp32 copy of x for one span
// (M x 1024 x 4 bytes) stays in L2 whatever K is.
//
// int8 weights (the cpu backend's int8 format) run on the same kernels: s8 weights and u8 - 128 activations are
// widened to fp32 (exact) instead of bf16 ones; ALPAMAYO_CPU_KERNELS op matmul_int8. They also run on
// "avx512_vnni" (int8 only; dot_matmul_avx512.cpp): vpdpbusd, the exact int32 sum rounded once to fp32, with
// the rows of each span packed in quads (4 consecutive k of a column side by side). It equals the FMA chain
// wherever that chain is exact (every partial sum below 2^24 in magnitude), and is never less accurate.
//
// bf16 weights also run on "avx512_bf16" (bf16 only; dot_matmul_avx512.cpp): vdpbf16ps on pairs of k packed side
// by side, fp32 sums. Its products are exact too, but it adds them in its own order (and flushes denormals), so
// it is not bitwise equal to the FMA chain; its results do not depend on M, N or the column slice either.
//
// bf16 weights also run on "amx_bf16" (bf16 only; amx_matmul_avx512.cpp), where AMX-BF16 is granted: tdpbf16ps on
// tiles, reading avx512_bf16's layout, with the weights prefetched so that they stream at the read bandwidth. Its
// own summation order (tile by tile of 32 k); its results do not depend on M, N or the column slice either.
//
// int8 weights also run on "amx_int8" (int8 only; amx_int8_matmul_avx512.cpp), where AMX-INT8 is granted: tdpbusd on
// tiles, reading avx512_vnni's layout (its quads are the B tile's rows), u8 x s8 summed in int32 minus 128 x the
// column sum: the exact sum rounded once, so the same bits as avx512_vnni.
//
// int8 weights also run on "avx2_int8" (dot_matmul_avx2.cpp), for CPUs without VNNI: q and w widened to int16 and
// multiplied in pairs of k by vpmaddwd into int32; the exact int32 sum rounded once to fp32, so the same bits as
// avx512_vnni.
//
// Summation order of the FMA kernels: every output element is the fp32 chain acc = 0; acc = fma(x[m][k], w[n][k],
// acc) for k = 0, 1, ..., K-1, whatever M, N, the column slice, the register block or the kernel. The FMA kernels
// (AVX-512, AVX2, portable) therefore give bitwise identical results, and so does any split of the columns over
// threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/runtime/huge_buf.h"
#include "backends/cpu/runtime/isa.h"

namespace alpamayo::cpu {

enum class MatmulKernel { Avx512, Avx2, Portable, Avx512Vnni, Avx512Bf16, Avx2Int8, AmxBf16, AmxInt8 };

// "avx512_fma", "avx2_fma", "portable_fma", "avx512_vnni", "avx512_bf16", "avx2_int8", "amx_bf16", "amx_int8": the
// names ALPAMAYO_CPU_KERNELS uses for matmul_bf16 and matmul_int8.
const char* matmul_kernel_name(MatmulKernel k);
// Whether the kernel multiplies bf16 weights (all but avx512_vnni, avx2_int8 and amx_int8) and int8 ones (all but
// avx512_bf16 and amx_bf16).
bool matmul_kernel_takes_bf16(MatmulKernel k);
bool matmul_kernel_takes_int8(MatmulKernel k);
// The largest K whose int32 sums cannot overflow on avx512_vnni and amx_int8 (255 * 128 * K < 2^31: u8 x s8 before
// the correction); none for the others.
inline constexpr int kVnniMaxK = 65700;
// The same for avx2_int8 (128 * 128 * K < 2^31: |q| <= 128 with x's u8 of any value, |w| <= 128).
inline constexpr int kAvx2Int8MaxK = 131000;
// Whether the kernel may run within `i` (isa(), or a model's cap: isa_with_cap); the portable one always.
bool matmul_kernel_runnable(MatmulKernel k, const IsaInfo& i = isa());
// Empty when runnable, else why not ("needs AVX-512 with AVX512-VNNI (usable here: ...)").
std::string matmul_kernel_unavailable(MatmulKernel k, const IsaInfo& i = isa());
// Empty when the kernel takes weights of this type (int8 or bf16) with K rows, else why not ("multiplies int8
// weights only", or avx512_vnni's int32 bound). MatmulWeights::pack* throws with it; the backend's choice skips.
std::string matmul_kernel_refuses(MatmulKernel k, bool int8, int K);
// The instruction doing its multiply-adds ("vpdpbusd zmm", "vfmadd231ps ymm", ...; peaks.h measures its peak);
// "" for the portable kernel.
const char* matmul_kernel_instruction(MatmulKernel k);
// The kernel named `name` (matmul_kernel_name); false for any other name.
bool matmul_kernel_from_name(const std::string& name, MatmulKernel* k);
// Every kernel, our dot-product kernels first (the order the cpu backend tries them in; oneDNN goes after amx_bf16
// and amx_int8).
inline constexpr MatmulKernel kMatmulKernels[] = {MatmulKernel::Avx512Vnni, MatmulKernel::Avx512Bf16,
                                                  MatmulKernel::Avx2Int8,   MatmulKernel::AmxBf16,
                                                  MatmulKernel::AmxInt8,    MatmulKernel::Avx512,
                                                  MatmulKernel::Avx2,       MatmulKernel::Portable};
// Output columns per packed panel.
int matmul_panel_width(MatmulKernel k);
// Where column j (< matmul_panel_width(k)) of a panel sits within a packed row (a k-group's row for the dot-product
// kernels): j itself, except for avx512_fma's bf16 weights, whose 32-column halves are interleaved (columns c and
// c + 16 side by side in one 32-bit word), so that one shift and one mask widen a 32-weight load to two zmm of
// fp32 where a zero-extension and a shift widened 16 (on CPUs where both take the FMA ports' issue slots).
int matmul_packed_slot(MatmulKernel k, bool int8, int j);

// The weights' element type: bf16 (x bf16), or int8 (x u8 = q + 128, the cpu backend's int8 activations).
enum class MatmulType { BF16, INT8 };

// One buffer that several packed matrices share (MatmulWeights::pack* with an arena): the cpu backend packs a
// thread's columns of a layer as chunks, back to back in one huge-page buffer, where buffers of their own
// would each be too small for a huge page.
struct MatmulArena {
  std::shared_ptr<HugeBuf> buf;
  size_t size = 0;  // bytes of buf
  size_t used = 0;  // bytes taken so far (each matrix's start is 64-byte aligned)
  explicit MatmulArena(size_t bytes) : buf(std::make_shared<HugeBuf>(bytes)), size(bytes) {}
};

// One packed weight matrix (a thread's column slice) for one kernel. Immutable once packed; copies share it.
class MatmulWeights {
 public:
  // Packs W [N, K] (fp32 rows, rounded to bf16 to nearest even) for kernel k (matmul_kernel_takes_bf16(k), else
  // alpamayo::Error; the int8 packers likewise need matmul_kernel_takes_int8(k)). Into a buffer of its own, or
  // into `arena` from its first unused byte (alpamayo::Error where packed_bytes() do not fit).
  void pack(MatmulKernel k, const float* W, int K, int N, MatmulArena* arena = nullptr);
  // Packs W [N, K] already in bf16.
  void pack_bf16(MatmulKernel k, const uint16_t* W, int K, int N, MatmulArena* arena = nullptr);
  // int8: W [N, K] quantized per output row by quantize_weight_rows (cpu_ops.h), as the oneDNN int8 path is:
  // scale max|w| / 127, q = round(w / scale) in [-127, 127]. The kernel widens x (u8 = q + 128) to q itself, so y is
  // sum_k q_x w_q (products exact in fp32) and col_correction() is all zeros; col_scale() the row scales.
  void pack_int8(MatmulKernel k, const float* W, int K, int N, MatmulArena* arena = nullptr);
  // int8 with given values and scales (tests).
  void pack_s8(MatmulKernel k, const int8_t* Wq, const float* scales, int K, int N, MatmulArena* arena = nullptr);
  // Bytes an arena needs for one packed [N, K] matrix (int8 or bf16 weights), its alignment included.
  static size_t packed_bytes(MatmulKernel k, bool int8, int K, int N);

  MatmulKernel kernel() const { return kernel_; }
  MatmulType type() const { return type_; }
  int K() const { return K_; }
  int N() const { return N_; }
  const uint16_t* data() const { return reinterpret_cast<const uint16_t*>(bytes_ptr()); }  // bf16
  const int8_t* data_s8() const { return reinterpret_cast<const int8_t*>(bytes_ptr()); }    // int8
  size_t bytes() const { return bytes_; }
  // int8: the epilogue's inputs (as OnednnLinear's): zeros and the weight scales; nullptr for bf16.
  const float* col_correction() const { return corr_.empty() ? nullptr : corr_.data(); }
  const float* col_scale() const { return scale_.empty() ? nullptr : scale_.data(); }
  // avx512_vnni, amx_int8: sum_k w[n][k] per column (the kernel subtracts 128 x it); empty for the other kernels.
  const int32_t* col_sums() const { return colsum_.empty() ? nullptr : colsum_.data(); }

 private:
  template <class T>
  void pack_with(MatmulKernel k, int K, int N, const T* W, MatmulArena* arena);  // W [N, K], row-major
  const char* bytes_ptr() const { return buf_ ? static_cast<const char*>(buf_->data()) + off_ : nullptr; }
  MatmulKernel kernel_ = MatmulKernel::Portable;
  MatmulType type_ = MatmulType::BF16;
  int K_ = 0, N_ = 0;
  size_t bytes_ = 0, off_ = 0;
  std::shared_ptr<const HugeBuf> buf_;  // huge pages: the weights stream cold from DRAM every step
  std::vector<float> corr_, scale_;
  std::vector<int32_t> colsum_;
};

// Scratch bytes (64-byte aligned memory) run_matmul needs for M rows of K: x widened to fp32 and one
// widened weight block (avx512_vnni, avx512_bf16: x copied to rows of K rounded up to the k-group; avx2_int8: q as
// int16 in such rows, one int16 weight block and a panel's int32 sums).
size_t matmul_scratch_bytes(MatmulKernel k, int M, int K);

// y[m][n] = sum_k x[m][k] w[n][k] (the fixed order above) for m < M, n < w.N(): x [M, ldx] bf16 (bf16 weights)
// or u8 = q + 128 (int8 weights; the sum is over q), y fp32 [M, ldy]. Runs w.kernel(), which must be runnable
// here; M == 0 or N == 0 does nothing. x_ready: the last call on this scratch had the same x, M, ldx, K and
// kernel, so the copy of x it left there (widened, or padded to the k-group) is reused instead of made again;
// that is what lets a thread run a matrix as several column chunks (the cpu backend's work stealing).
void run_matmul(const MatmulWeights& w, const void* x, int M, int ldx, float* y, int ldy, void* scratch,
                bool x_ready = false);

// Several matrices of one kernel and K on the same x, each into its own y: out[i].y = x out[i].w^T, each bitwise as
// run_matmul would give it. amx_bf16 at many rows runs their panels as one sequence (its panel groups then span
// the matrices: a thread's narrow column chunks still share each chunk of x among a group); the other kernels
// run them in turn. x_ready as for run_matmul.
struct MatmulOut {
  const MatmulWeights* w;
  float* y;
  int ldy;
};
void run_matmul_many(const MatmulOut* out, int n, const void* x, int M, int ldx, void* scratch, bool x_ready = false);
// Columns worth running in one run_matmul_many call with kernel k at M rows (whole chunks are taken until
// they reach it): 0 where the kernel gains nothing from it (one chunk per call keeps the work stealing finest).
int matmul_many_columns(MatmulKernel k, int M);

// Internal: the kernels on raw packed panels (fma_matmul_avx512.cpp, fma_matmul_avx2.cpp, matmul_kernels.cpp).
// scratch: matmul_scratch_bytes(kernel, M, K).
void fma_matmul_avx512(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                       float* scratch, bool x_ready);
void fma_matmul_avx2(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                     float* scratch, bool x_ready);
void fma_matmul_portable(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                         float* scratch, bool x_ready);
void fma_matmul_s8_avx512(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                          float* scratch, bool x_ready);
void fma_matmul_s8_avx2(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                        float* scratch, bool x_ready);
void fma_matmul_s8_portable(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                            float* scratch, bool x_ready);
void fma_matmul_s8_avx512vnni(const int8_t* w, const int32_t* colsum, int K, int N, const uint8_t* x, int M, int ldx,
                              float* y, int ldy, uint8_t* scratch, bool x_ready);
void dot_matmul_s8_avx2(const int8_t* w, int K, int N, const uint8_t* x, int M, int ldx, float* y, int ldy,
                        uint8_t* scratch, bool x_ready);
void dot_matmul_avx512bf16(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                           void* scratch, bool x_ready);
void amx_matmul_bf16(const uint16_t* w, int K, int N, const uint16_t* x, int M, int ldx, float* y, int ldy,
                     void* scratch, bool x_ready);
// amx_bf16 on several matrices of the same K (run_matmul_many): their panels in order, as one matrix's.
struct AmxBf16Part {
  const uint16_t* w;
  int N;
  float* y;
  int ldy;
};
void amx_matmul_bf16_parts(const AmxBf16Part* parts, int nparts, int K, const uint16_t* x, int M, int ldx,
                           void* scratch, bool x_ready);
// Rows from which amx_bf16 runs groups of panels per chunk of k (and columns worth one call there).
inline constexpr int kAmxManyRows = 128;
inline constexpr int kAmxManyColumns = 256;  // one group of 4 panels: the work stealing stays fine
// amx_bf16's scratch: x as A tiles, K rounded up to 32 and M to 32, and the fp32 sums of a group of panels.
size_t amx_matmul_scratch_bytes(int M, int K);
// The k pairs per chunk amx_bf16 runs for M rows and a span of ks values of K (a multiple of 16 pairs; a span
// taken whole means its sums never go through the fp32 buffer between chunks).
int amx_matmul_chunk_pairs(int M, int ks);
void amx_matmul_s8(const int8_t* w, const int32_t* colsum, int K, int N, const uint8_t* x, int M, int ldx, float* y,
                   int ldy, void* scratch, bool x_ready);
// amx_int8's scratch: x in A tiles of K rounded up to 64 for M rounded up to 32, and the int32 sums of a group of
// panels (one panel below kAmxManyRows rows).
size_t amx_int8_matmul_scratch_bytes(int M, int K);

// K rows per widened weight block (both ISA kernels; the scratch holds one block of kFmaKBlock x 64 fp32).
inline constexpr int kFmaKBlock = 128;
// K rows per span of the packed layout (a multiple of every kernel's K block: 64, 256).
inline constexpr int kFmaKSpan = 1024;
// The same for the dot-product kernels (avx512_vnni, avx512_bf16, avx2_int8), which keep x as it is (no fp32 copy
// per span): one span covers the seed's K (1536, 2048, 6144), so a panel's partial sums never go back to memory
// between spans: with six samples (M = 384) those round trips were a large share of the int8 gate_up phase
// (docs/PERFORMANCE.md). A multiple of kFmaKSpan, so the kernels' K blocks, and with them every sum, are the same.
inline constexpr int kDotKSpan = 8 * kFmaKSpan;
// K rows per widened (int16) weight block of avx2_int8; its scratch holds one such block of 16 columns.
inline constexpr int kAvx2Int8KBlock = 512;
// The span of kernel k's packed layout.
int matmul_k_span(MatmulKernel k);
// k per packed group: the dot-product kernels keep a group of consecutive k of one column side by side (4 for
// avx512_vnni and amx_int8, 2 for avx2_int8 and avx512_bf16), the others 1.
int matmul_k_group(MatmulKernel k);

}  // namespace alpamayo::cpu
