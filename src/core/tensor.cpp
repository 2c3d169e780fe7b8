#include "alpamayo/tensor.h"

#include <cmath>
#include <sstream>

#include "alpamayo/error.h"

namespace alpamayo {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  static const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64,
                              DType::I32, DType::I16, DType::I8,   DType::U8,  DType::BOOL};
  for (DType t : all)
    if (s == dtype_name(t)) { *out = t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;           // overflow (incl. rounding up) -> Inf
  if (a < 0x38800000u) {                                  // subnormal or zero in f16
    if (a < 0x33000000u) return sign;                     // below half the smallest subnormal
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // value = mant * 2^(E-150) = r * 2^-24: 14..24
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((a >> 13) - ((127 - 15) << 10));
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {

// Index of the first value in [begin, end) whose exponent bits are all ones (NaN/Inf), or -1. Chunks are OR-reduced
// without an early exit, which the compiler vectorises, and only a chunk that has one is searched again: several
// times faster than a per-value early exit on a full-size cache (docs/PERFORMANCE.md).
template <class U, U kMask>
int64_t first_exponent_all_ones(const U* u, int64_t begin, int64_t end) {
  constexpr int64_t kChunk = 2048;
  int64_t i0 = begin;
  for (; i0 + kChunk <= end; i0 += kChunk) {
    U bad = 0;
    for (int64_t i = 0; i < kChunk; ++i) bad |= U((u[i0 + i] & kMask) == kMask);
    if (bad) break;
  }
  for (int64_t i = i0; i < end; ++i)
    if ((u[i] & kMask) == kMask) return i;
  return -1;
}

}  // namespace

int64_t first_non_finite(const TensorView& t, int64_t begin, int64_t end) {
  if (end < 0) end = t.numel();
  if (t.dtype == DType::F32)
    return first_exponent_all_ones<uint32_t, 0x7f800000u>(static_cast<const uint32_t*>(t.data), begin, end);
  if (t.dtype == DType::BF16)
    return first_exponent_all_ones<uint16_t, 0x7f80>(static_cast<const uint16_t*>(t.data), begin, end);
  if (t.dtype == DType::F16)
    return first_exponent_all_ones<uint16_t, 0x7c00>(static_cast<const uint16_t*>(t.data), begin, end);
  return -1;
}

FiniteScan scan_finite(const TensorView& t, int64_t begin, int64_t end) {
  if (end < 0) end = t.numel();
  FiniteScan r;
  for (int64_t i = begin; i < end; ++i) {
    float v = 0;
    if (t.dtype == DType::F32) v = static_cast<const float*>(t.data)[i];
    else if (t.dtype == DType::BF16) v = bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    else if (t.dtype == DType::F16) v = f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    else return r;
    if (!std::isfinite(v)) {
      if (r.first_bad < 0) r.first_bad = i;
    } else if (std::fabs(v) > r.max_abs || r.argmax < 0) {
      r.max_abs = std::fabs(v);
      r.argmax = i;
    }
  }
  return r;
}

std::string index_str(const std::vector<int64_t>& shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] > 0 ? i % shape[k] : 0;
    i = shape[k] > 0 ? i / shape[k] : 0;
  }
  return shape_str(idx);
}

void expect_finite(const TensorView& t) {
  if (!t.device.host_accessible() || !is_float(t.dtype) || !t.is_contiguous()) return;
  const int64_t i = first_non_finite(t);
  if (i < 0) return;
  float v = 0;
  if (t.dtype == DType::F32) v = static_cast<const float*>(t.data)[i];
  else if (t.dtype == DType::BF16) v = bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
  else v = f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
  throw Error(t.name + ": non-finite value " + (std::isnan(v) ? std::string("nan") : v > 0 ? "inf" : "-inf") + " at " +
              index_str(t.shape, i));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda:" + std::to_string(id);
    case DeviceType::CUDAHost: return "cuda_host";
  }
  return "device type " + std::to_string(static_cast<int>(type));
}

bool TensorView::is_contiguous() const {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  int64_t want = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != want) return false;
    want *= shape[i];
  }
  return true;
}

void expect_host_contiguous(const TensorView& t, const std::string& who) {
  check(t.device.host_accessible(), t.name + ": lives in " + t.device.str() + " memory, which " + who +
                                        " cannot read (bind it to a backend for that device)");
  check(t.is_contiguous(), t.name + ": " + who + " needs a row-major contiguous tensor, found shape " +
                               shape_str(t.shape) + " with strides " + shape_str(t.strides));
}

void expect_float(const TensorView& t) {
  check(is_float(t.dtype), t.name + ": expected dtype F32, F16 or BF16, found " + dtype_name(t.dtype));
}

void convert_to_f32(const TensorView& t, float* out) {
  expect_float(t);
  expect_host_contiguous(t, "the host conversion");
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::F32: if (n > 0) std::memcpy(out, t.data, n * 4); break;  // memcpy from/to null is UB even for 0 bytes
    case DType::BF16: {
      auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::F16: {
      auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
    default: break;
  }
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert_to_f32(t, v.data());
  return v;
}

void convert_to_bf16(const TensorView& t, uint16_t* out) {
  expect_float(t);
  expect_host_contiguous(t, "the host conversion");
  const int64_t n = t.numel();
  if (t.dtype == DType::BF16) {
    if (n > 0) std::memcpy(out, t.data, n * 2);
  } else if (t.dtype == DType::F32) {
    auto* p = static_cast<const float*>(t.data);
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(p[i]);
  } else {
    auto* p = static_cast<const uint16_t*>(t.data);
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f16_to_f32(p[i]));
  }
}

void expect_shape(const TensorView& t, const std::vector<int64_t>& shape) {
  check(t.shape == shape, t.name + ": expected shape " + shape_str(shape) + ", found " + shape_str(t.shape));
}

Tensor Tensor::make(DType dtype, std::vector<int64_t> shape, const void* src) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(t.view().nbytes(), 0);
  if (src) std::memcpy(t.bytes.data(), src, t.bytes.size());
  return t;
}

}  // namespace alpamayo
