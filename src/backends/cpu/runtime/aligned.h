// A minimal 64-byte aligned, zero-initialised buffer for kernel operands and scratch.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace alpamayo::cpu {

template <class T>
class AlignedBuf {
 public:
  AlignedBuf() = default;
  explicit AlignedBuf(size_t n) { resize(n); }
  ~AlignedBuf() { std::free(p_); }
  AlignedBuf(AlignedBuf&& o) noexcept : p_(o.p_), n_(o.n_), cap_(o.cap_) {
    o.p_ = nullptr;
    o.n_ = o.cap_ = 0;
  }
  AlignedBuf& operator=(AlignedBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cap_, o.cap_);
    return *this;
  }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;

  // n elements, contents zeroed. The allocation is kept when it is large enough: a session rebinds its buffers
  // for every new context, and freeing and re-faulting them was a visible share of a full-size bind.
  // resize(0) frees it (data() is then nullptr).
  void resize(size_t n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    n_ = n;
    if (n == 0 || bytes > cap_) {
      std::free(p_);
      p_ = nullptr;
      cap_ = 0;
      if (n == 0) return;
      p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (!p_) throw std::bad_alloc();
      cap_ = bytes;
    }
    std::memset(static_cast<void*>(p_), 0, bytes);
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return cap_; }  // allocated, which a smaller resize keeps
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;  // elements in use; bytes allocated
};

}  // namespace alpamayo::cpu
