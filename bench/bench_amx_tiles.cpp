// The AMX tile loop by where its operands come from (one thread, thread CPU time): the ceilings behind the AMX
// figures of docs/PERFORMANCE.md ("AMX, sixth pass").
//
// The loop is amx_bf16's (matmul and attention): 4 fp32 accumulators (tmm0-3) fed by 2 A and 2 B tiles per step,
// 4 tdpbf16ps per 4 tile loads, every tile 16 rows of 64 bytes, contiguous. Measured with the operands
//   - in registers only (the roofline's peak, measured_peaks' loop),
//   - cycling through sets of 16 KB (L1), 256 KB (L2) and 1 MB each (beyond L2: 2 MB pages, then 4 KB pages),
//   - from L2 with 3 accumulators and a spare B tile instead, so that every tile load is issued at least two
//     products ahead of its use (the tiles are not renamed: in the 2 x 2 loop a load waits for the products
//     reading the tile it replaces),
// and the weights streamed from memory at the seed's 64 rows: each 2 KB pair of B tiles read once from a buffer
// far larger than the last-level cache and used by two 32-row blocks (the second time from L1), so 64 flops per
// byte, with and without a prefetch into L2 64 KB ahead, against the read bandwidth measured in the same
// process. (The accumulators are the same 4 for both row blocks: the tile work and traffic of M = 64, not a
// matmul; a real one needs 8 accumulators or a second pass over the weights.)
//
// Without AMX (or without the OS's grant) it says so and exits 0: nothing here can run there.
#include <sys/mman.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <immintrin.h>
#include <stdexcept>
#include <string>
#include <utility>

#include "backends/cpu/profile/peaks.h"
#include "backends/cpu/runtime/isa.h"

namespace {

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Anonymous memory on 2 MB pages (huge) or 4 KB pages, filled with small bf16 values (no zeros, no denormals).
struct Buffer {
  char* p = nullptr;
  size_t n = 0;
  Buffer(size_t bytes, bool huge) : n((bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20)) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("cannot map " + std::to_string(n >> 20) + " MiB");
    p = static_cast<char*>(m);
    madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    auto* h = reinterpret_cast<uint16_t*>(p);
    for (size_t i = 0; i < n / 2; ++i) h[i] = uint16_t(0x3c00 + i % 61);  // 2^-7 .. about 2^-6.5
  }
  ~Buffer() { munmap(p, n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) void load_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  asm volatile("" : : "m"(c) : "memory");  // GCC 12's _tile_loadconfig declares 8 bytes read only
  _tile_loadconfig(&c);
}

// One step of the 2 x 2 loop: A tiles at a, a + 1 KB, B tiles at b, b + 1 KB, each loaded just before its first
// product (the order of amx_bf16's loops).
__attribute__((target("amx-tile,amx-bf16"), always_inline)) inline void step_2x2(const char* a, const char* b) {
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b + 1024, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a + 1024, 64);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// The configuration and the four accumulators zeroed; at the end one accumulator stored (which waits for every
// product into it) and the tiles released: whether its values stayed finite.
__attribute__((target("amx-tile"))) void begin_2x2() {
  load_config();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
__attribute__((target("amx-tile"))) bool end_tiles(int t) {
  alignas(64) float out[256];
  if (t == 2) _tile_stored(2, out, 64);
  else _tile_stored(3, out, 64);
  _tile_release();
  return std::isfinite(out[0]) && std::isfinite(out[255]);
}

// 2 x 2: per step A tiles at a, a + 1 KB and B tiles at b, b + 1 KB, both advancing 2 KB a step and wrapping at
// their set's end. Returns TFLOP/s.
__attribute__((target("amx-tile,amx-bf16"))) double loop_2x2(const char* A, size_t a_set, const char* B, size_t b_set,
                                                             long steps) {
  begin_2x2();
  size_t ao = 0, bo = 0;
  const double t0 = thread_seconds();
  for (long i = 0; i < steps; ++i) {
    step_2x2(A + ao, B + bo);
    ao = ao + 2048 < a_set ? ao + 2048 : 0;
    bo = bo + 2048 < b_set ? bo + 2048 : 0;
  }
  const bool finite = end_tiles(3);
  const double t = thread_seconds() - t0;
  return finite ? 4.0 * 16 * 16 * 32 * 2 * double(steps) / t / 1e12 : -1.0;
}

// 3 x 1 with a spare B tile: accumulators tmm0-2 (48 rows), A tiles tmm3-5, B alternating tmm6 / tmm7; the next
// B is loaded a whole step ahead and each A right after its product. 3 products per 4 tile loads. TFLOP/s.
// One step: the products on B tile CUR while the next B goes into tile NEXT. A macro: GCC's tile intrinsics are
// macros that paste their tile numbers into the instruction text, so the numbers must be literal tokens.
#define ALP_STEP_3X1(CUR, NEXT, a, b) \
  do {                                \
    _tile_loadd(NEXT, b, 64);         \
    _tile_dpbf16ps(0, 3, CUR);        \
    _tile_loadd(3, a, 64);            \
    _tile_dpbf16ps(1, 4, CUR);        \
    _tile_loadd(4, (a) + 1024, 64);   \
    _tile_dpbf16ps(2, 5, CUR);        \
    _tile_loadd(5, (a) + 2048, 64);   \
  } while (0)
__attribute__((target("amx-tile,amx-bf16"))) double loop_3x1(const char* A, size_t a_set, const char* B, size_t b_set,
                                                             long steps) {
  load_config();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_loadd(3, A, 64);
  _tile_loadd(4, A + 1024, 64);
  _tile_loadd(5, A + 2048, 64);
  _tile_loadd(6, B, 64);
  size_t ao = 0, bo = 0;
  auto advance = [&] {
    ao = ao + 3072 < a_set ? ao + 3072 : 0;
    bo = bo + 1024 < b_set ? bo + 1024 : 0;
  };
  const double t0 = thread_seconds();
  for (long i = 0; i < steps; i += 2) {
    advance();
    ALP_STEP_3X1(6, 7, A + ao, B + bo);
    advance();
    ALP_STEP_3X1(7, 6, A + ao, B + bo);
  }
  const bool finite = end_tiles(2);
  const double t = thread_seconds() - t0;
  const long done = (steps + 1) / 2 * 2;
  return finite ? 3.0 * 16 * 16 * 32 * 2 * double(done) / t / 1e12 : -1.0;
}

// The weights streamed once through bytes of B (2 KB a step, each pair used by both 32-row blocks of x from a
// 128 KB set), a prefetch into L2 `ahead` bytes ahead (0: none). Returns GB/s of B.
__attribute__((target("amx-tile,amx-bf16"))) double loop_stream(const char* A, const char* B, size_t bytes,
                                                                 size_t ahead) {
  begin_2x2();
  constexpr size_t kXSet = 128 << 10;
  size_t ao = 0;
  const double t0 = thread_seconds();
  for (size_t bo = 0; bo + 2048 <= bytes; bo += 2048) {
    if (ahead > 0 && bo + ahead + 2048 <= bytes)
      for (int l = 0; l < 32; ++l) _mm_prefetch(B + bo + ahead + 64 * l, _MM_HINT_T1);
    for (int r = 0; r < 2; ++r) {
      step_2x2(A + ao, B + bo);
      ao = ao + 2048 < kXSet ? ao + 2048 : 0;
    }
  }
  const bool finite = end_tiles(3);
  const double t = thread_seconds() - t0;
  return finite ? double(bytes) / t / 1e9 : -1.0;
}

template <class F>
double best_of(int reps, F f) {
  double best = 0;
  for (int r = 0; r < reps; ++r) best = std::max(best, f());
  return best;
}

}  // namespace

namespace {
int run(int argc, char** argv) {
  CLI::App app{"The AMX tile loop by where its operands come from (one thread)"};
  int reps = 3;
  size_t stream_mb = 1024;
  long steps = 400000;
  bool quick = false;
  app.add_option("--reps", reps, "passes per figure (the best is printed)")->check(CLI::Range(1, 100));
  app.add_option("--stream-mb", stream_mb, "MiB of weights streamed (must dwarf the last-level cache)")
      ->check(CLI::Range(8, 16384));
  app.add_option("--steps", steps, "2 x 2 steps per cached-operand figure")->check(CLI::Range(1000L, 100000000L));
  app.add_flag("--quick", quick, "a short run (smoke test): 20,000 steps, 64 MiB streamed, one pass");
  CLI11_PARSE(app, argc, argv);
  if (quick) reps = 1, stream_mb = 64, steps = 20000;

  using namespace alpamayo::cpu;
  const IsaInfo& cpu = isa();
  if (!cpu.has(kAmxBf16)) {
    std::printf("AMX-BF16 is not usable here (%s): nothing to measure\n", cpu.describe().c_str());
    return 0;
  }
  bool ok = true;
  auto row = [&](const char* what, double v, const char* unit) {
    const bool good = v > 0 && std::isfinite(v);
    ok = ok && good;
    std::printf("%-58s %7.2f %s%s\n", what, v, unit, good ? "" : "  <- not a positive rate");
  };
  double ops = 0;
  row("2 x 2, registers only (the roofline's peak loop)", best_of(reps, [&] {
        const long it = steps;
        const double t0 = thread_seconds();
        const float v = peak_loop_amx_bf16(it, 1.f, &ops);
        return std::isfinite(v) ? ops * double(it) / (thread_seconds() - t0) / 1e12 : -1.0;
      }), "TFLOP/s");
  {
    Buffer a(2 << 20, true), b(2 << 20, true);
    for (const auto& [set, name] : {std::pair<size_t, const char*>{16 << 10, "2 x 2, A and B each from 16 KB (L1)"},
                                    {256 << 10, "2 x 2, A and B each from 256 KB (L2)"},
                                    {1 << 20, "2 x 2, A and B each from 1 MB, 2 MB pages"}})
      row(name, best_of(reps, [&] { return loop_2x2(a.p, set, b.p, set, steps); }), "TFLOP/s");
    row("3 x 1 + spare B, A and B each from 256 KB (L2)",
        best_of(reps, [&] { return loop_3x1(a.p, 3 * (96 << 10), b.p, 256 << 10, steps); }), "TFLOP/s");
  }
  {
    Buffer a(2 << 20, false), b(2 << 20, false);
    row("2 x 2, A and B each from 1 MB, 4 KB pages",
        best_of(reps, [&] { return loop_2x2(a.p, 1 << 20, b.p, 1 << 20, steps); }), "TFLOP/s");
  }
  {
    const double read = quick ? 0.0 : read_bandwidth_gbs(1);  // a 1 GiB+ read: not in the smoke run
    Buffer x(2 << 20, true), w(stream_mb << 20, true);
    const double none = best_of(reps, [&] { return loop_stream(x.p, w.p, w.n, 0); });
    const double pf = best_of(reps, [&] { return loop_stream(x.p, w.p, w.n, 64 << 10); });
    if (read > 0)
      std::printf("weights streamed at 64 rows (%zu MiB, read bandwidth %.1f GB/s on 1 thread):\n", stream_mb, read);
    else
      std::printf("weights streamed at 64 rows (%zu MiB, read bandwidth not measured):\n", stream_mb);
    row("  no prefetch", none, "GB/s");
    row("  prefetcht1 64 KB ahead", pf, "GB/s");
    if (read > 0)
      std::printf("  %-56s %6.1f%%\n", "best of the two, of the read bandwidth", 100.0 * std::max(none, pf) / read);
  }
  std::printf("cpu: %s\n", cpu.describe().c_str());
  return ok ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a buffer that cannot be had (--stream-mb beyond the memory)
    std::fprintf(stderr, "bench_amx_tiles: %s\n", e.what());
    return 1;
  }
}
