// Page-aligned anonymous memory whose whole 2 MiB extents are advised as transparent huge pages.
// The packed weights (4.8 GB, streamed cold from DRAM every step) live here: with 4 KiB pages each
// step walks ~1.2M pages and the per-slice matmuls run measurably slower on cold weights.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace alpamayo::cpu {

class HugeBuf {
 public:
  static constexpr size_t kHuge = size_t(2) << 20;

  HugeBuf() = default;
  explicit HugeBuf(size_t bytes) {
    if (bytes == 0) return;
    // Over-map by one huge page so the data can start on a 2 MiB boundary; unused ends are unmapped.
    const size_t len = (bytes + 4095) / 4096 * 4096;
    void* raw = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t a = (r + kHuge - 1) / kHuge * kHuge;
    if (a > r) munmap(raw, a - r);
    if (r + len + kHuge > a + len) munmap(reinterpret_cast<void*>(a + len), r + len + kHuge - (a + len));
    p_ = reinterpret_cast<char*>(a);
    n_ = len;
    // Only whole huge pages: advising the tail would make its first touch fault in a full 2 MiB page.
    // Advice is a hint; where THP is unavailable the buffer simply keeps small pages.
    if (const size_t whole = len / kHuge * kHuge) madvise(p_, whole, MADV_HUGEPAGE);
  }
  ~HugeBuf() {
    if (p_) munmap(p_, n_);
  }
  HugeBuf(HugeBuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HugeBuf& operator=(HugeBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  HugeBuf(const HugeBuf&) = delete;
  HugeBuf& operator=(const HugeBuf&) = delete;

  void* data() const { return p_; }

 private:
  char* p_ = nullptr;
  size_t n_ = 0;
};

// n elements of T in a HugeBuf: zero until written (fresh pages), not zeroed by us, so the first touch of a large
// buffer happens where it is filled, on the threads that fill it.
template <class T>
class HugeArray {
 public:
  void resize(size_t n) {
    buf_ = HugeBuf(n * sizeof(T));
    n_ = n;
  }
  T* data() const { return static_cast<T*>(buf_.data()); }
  size_t size() const { return n_; }

 private:
  HugeBuf buf_;
  size_t n_ = 0;
};

}  // namespace alpamayo::cpu
