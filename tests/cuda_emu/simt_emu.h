// A small SIMT emulator that runs the cuda backend's kernel source (*.cuh) on the host, so that tests check
// the kernels' indexing, masking and pipelines against CPU references on machines without a GPU.
//
// Every CUDA thread of a block is a coroutine (ucontext) on the calling thread; they take turns at every
// barrier, and blocks run one after another. __syncthreads is a block barrier, and the warp collectives
// (shuffles, mma.sync m16n8k16 bf16, ldmatrix .x4 .trans) exchange registers through per-warp slots,
// assembling the operands from the fragment layouts of the PTX ISA.
// cp.async copies at once (its waits are no-ops). fp32 accumulation order of mma differs from the
// hardware's, so results match a GPU to rounding, not bitwise. Test-only: slow, and it assumes warps that
// leave a kernel leave it whole (as these kernels do).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

// The CUDA keywords as host code: kernels become inline functions (their headers are compiled into several
// objects of one program), __shared__ arrays statics shared by the threads of the (one) running block.
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__ inline
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

inline thread_local uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace simt {

void yield();

// A barrier of `expected` coroutines: arrivals wait (yielding) until the last one comes; leavers drop out.
class Barrier {
 public:
  explicit Barrier(int expected) : expected_(expected) {}
  void arrive_and_wait() {
    const uint64_t g = gen_;
    if (++arrived_ == expected_) {
      arrived_ = 0;
      ++gen_;
      return;
    }
    while (gen_ == g) yield();
  }
  void arrive_and_drop() {
    --expected_;
    if (expected_ > 0 && arrived_ == expected_) {
      arrived_ = 0;
      ++gen_;
    }
  }

 private:
  int expected_, arrived_ = 0;
  uint64_t gen_ = 0;
};

struct Warp {
  explicit Warp(int n) : bar(n) {}
  Barrier bar;
  uint32_t u[32][8] = {};
  float f[32] = {};
  const void* p[32] = {};
};

struct Block {
  explicit Block(int n) : bar(n) {}
  Barrier bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<uint8_t> smem;
};

inline thread_local Block* tl_block = nullptr;
inline thread_local Warp* tl_warp = nullptr;
inline thread_local int tl_lane = 0;

inline void* dynamic_smem() { return tl_block->smem.data(); }

inline float bf16_lo(uint32_t v) {
  const uint32_t u = v << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bf16_hi(uint32_t v) {
  const uint32_t u = v & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// D (16x8 fp32) += A (16x16 bf16) B (16x8 bf16), the m16n8k16 fragments: lane = 4 g + t holds
// A (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B (k 2t..2t+1, n g), (k 2t+8.., n g);
// D (g, 2t..2t+1), (g+8, 2t..2t+1). The lower column / k index sits in the low 16 bits.
inline void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  Warp& w = *tl_warp;
  const int l = tl_lane;
  for (int i = 0; i < 4; ++i) w.u[l][i] = a[i];
  w.u[l][4] = b0;
  w.u[l][5] = b1;
  w.bar.arrive_and_wait();
  auto A = [&](int r, int k) {
    const uint32_t v = w.u[(r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
    return k % 2 ? bf16_hi(v) : bf16_lo(v);
  };
  auto B = [&](int k, int n) {
    const uint32_t v = w.u[n * 4 + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)];
    return k % 2 ? bf16_hi(v) : bf16_lo(v);
  };
  const int g = l / 4, t = l % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), c = 2 * t + (e & 1);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc += A(r, k) * B(k, c);
    out[e] = acc;
  }
  w.bar.arrive_and_wait();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// ldmatrix.sync.aligned.m8n8.x4.trans.b16: lanes 8i..8i+7 give the 8 row addresses (8 b16 each) of
// matrix i; transposed, lane l receives elements (rows 2(l%4), 2(l%4)+1; column l/4) of each matrix.
inline void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  Warp& w = *tl_warp;
  const int l = tl_lane;
  w.p[l] = p;
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const uint16_t* r0 = static_cast<const uint16_t*>(w.p[8 * i + 2 * (l % 4)]);
    const uint16_t* r1 = static_cast<const uint16_t*>(w.p[8 * i + 2 * (l % 4) + 1]);
    r[i] = uint32_t(r0[l / 4]) | (uint32_t(r1[l / 4]) << 16);
  }
  w.bar.arrive_and_wait();
}

inline void cp_async16(void* dst, const void* src, int src_bytes) {
  if (src_bytes > 0) std::memcpy(dst, src, src_bytes);
  if (src_bytes < 16) std::memset(static_cast<uint8_t*>(dst) + src_bytes, 0, 16 - src_bytes);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

inline std::mutex& atomic_mutex() {
  static std::mutex m;
  return m;
}

// The coroutines of the running block: their contexts, stacks and CUDA thread state.
struct Fiber {
  ucontext_t ctx;
  std::vector<uint8_t> stack;
  uint3 tid;
  Warp* warp = nullptr;
  int lane = 0;
  bool done = false;
};
struct Scheduler {
  ucontext_t main;
  std::vector<Fiber> fibers;
  int current = -1;
  const std::function<void(int)>* job = nullptr;
};
inline Scheduler& scheduler() {
  static Scheduler s;
  return s;
}
inline void fiber_entry() {
  Scheduler& s = scheduler();
  const int i = s.current;
  (*s.job)(i);
  s.fibers[i].done = true;
  swapcontext(&s.fibers[i].ctx, &s.main);
}
// Back to the scheduler, which resumes the next coroutine.
inline void yield() {
  Scheduler& s = scheduler();
  swapcontext(&s.fibers[s.current].ctx, &s.main);
}

// One launch at a time per process, whichever kernel: the scheduler, gridDim, blockDim and the __shared__
// statics are process-wide (sessions in several threads launch concurrently).
inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

// Runs kernel(args...) over the grid: blocks one after another, the threads of a block as coroutines that
// take turns at barriers. One launch at a time per process (launch_mutex).
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
  std::lock_guard<std::mutex> g(launch_mutex());
  gridDim = grid;
  blockDim = block;
  const int n = static_cast<int>(block.x * block.y * block.z);
  Scheduler& s = scheduler();
  s.fibers.resize(n);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block blk(n);
        blk.smem.assign(smem, 0xcd);  // garbage, as on a GPU
        for (int w0 = 0; w0 < n; w0 += 32) blk.warps.push_back(std::make_unique<Warp>(std::min(32, n - w0)));
        blockIdx = uint3{bx, by, bz};
        tl_block = &blk;
        const std::function<void(int)> job = [&](int) {
          kernel(args...);
          tl_warp->bar.arrive_and_drop();
          blk.bar.arrive_and_drop();
        };
        s.job = &job;
        for (int i = 0; i < n; ++i) {
          Fiber& f = s.fibers[i];
          f.stack.resize(size_t(1) << 18);
          f.tid = uint3{unsigned(i % block.x), unsigned(i / block.x % block.y), unsigned(i / (block.x * block.y))};
          f.warp = blk.warps[i / 32].get();
          f.lane = i % 32;
          f.done = false;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.data();
          f.ctx.uc_stack.ss_size = f.stack.size();
          f.ctx.uc_link = nullptr;
          makecontext(&f.ctx, fiber_entry, 0);
        }
        for (int alive = n; alive > 0;) {
          alive = 0;
          for (int i = 0; i < n; ++i) {
            Fiber& f = s.fibers[i];
            if (f.done) continue;
            s.current = i;
            threadIdx = f.tid;
            tl_warp = f.warp;
            tl_lane = f.lane;
            swapcontext(&s.main, &f.ctx);
            alive += f.done ? 0 : 1;
          }
        }
        s.current = -1;
      }
}

}  // namespace simt

inline void __syncthreads() { simt::tl_block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { simt::tl_warp->bar.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  simt::Warp& w = *simt::tl_warp;
  w.f[simt::tl_lane] = v;
  w.bar.arrive_and_wait();
  const float r = w.f[simt::tl_lane ^ o];
  w.bar.arrive_and_wait();
  return r;
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> g(simt::atomic_mutex());
  const unsigned long long old = *p;
  *p = std::min(old, v);
  return old;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
