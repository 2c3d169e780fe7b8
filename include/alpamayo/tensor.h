// Element types, devices and non-owning tensor views (DLPack model: device, dtype, shape, strides), plus
// conversions to fp32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "alpamayo/error.h"

namespace alpamayo {

enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
bool parse_dtype(const std::string& s, DType* out);
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

std::string shape_str(const std::vector<int64_t>& shape);

// Where tensor memory lives. The codes are DLPack's DLDeviceType values (kDLCPU = 1, kDLCUDA = 2,
// kDLCUDAHost = 3), so a DLPack tensor maps onto a view without translation.
enum class DeviceType : int { CPU = 1, CUDA = 2, CUDAHost = 3 };
struct Device {
  DeviceType type = DeviceType::CPU;
  int id = 0;
  // Host code may dereference the memory (CPU, or pinned CUDA host memory).
  bool host_accessible() const { return type == DeviceType::CPU || type == DeviceType::CUDAHost; }
  std::string str() const;  // "cpu", "cuda:0", "cuda_host"
  bool operator==(const Device&) const = default;
};

// A view of tensor data owned elsewhere (an mmap'd file, a caller's buffer, device memory).
// strides are in elements, as in DLPack; empty means row-major contiguous.
struct TensorView {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string name;  // "file: key" for error messages
  std::vector<int64_t> strides{};
  Device device{};

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // True when strides are empty or equal to the row-major strides of shape (size-1 dims ignored).
  bool is_contiguous() const;
};

// Converts a float tensor (F32/F16/BF16) to fp32; throws naming the tensor for other dtypes.
void convert_to_f32(const TensorView& t, float* out);
std::vector<float> to_f32(const TensorView& t);
// Converts a float tensor (F32/F16/BF16) to bf16.
void convert_to_bf16(const TensorView& t, uint16_t* out);

// Finiteness of a host, contiguous float tensor (F32/F16/BF16) over flat elements [begin, end) (end -1: all).
// first_non_finite tests exponent bits only (memory speed); scan_finite also finds the largest finite magnitude.
int64_t first_non_finite(const TensorView& t, int64_t begin = 0, int64_t end = -1);
struct FiniteScan {
  int64_t first_bad = -1;  // flat index of the first NaN/Inf, -1 if none
  float max_abs = 0;       // largest finite magnitude
  int64_t argmax = -1;     // its flat index
};
FiniteScan scan_finite(const TensorView& t, int64_t begin = 0, int64_t end = -1);
// Flat index i of `shape` as "[a, b, c]".
std::string index_str(const std::vector<int64_t>& shape, int64_t i);
// Throws Error (non-finite) naming the tensor and the index unless every value is finite (the weights at load).
void expect_finite(const TensorView& t);

// Throws Error(code) unless t has exactly this shape; the message names the tensor. code: Format for a tensor
// read from a file, InvalidArgument for one the caller passed.
void expect_shape(const TensorView& t, const std::vector<int64_t>& shape, ErrorCode code = ErrorCode::InvalidArgument);
// Throws Error(code) unless t is one of the float dtypes.
void expect_float(const TensorView& t, ErrorCode code = ErrorCode::InvalidArgument);
// Throws unless host code can read t (Unsupported: memory of another device) and it is row-major contiguous
// (InvalidArgument); `who` names the reader.
void expect_host_contiguous(const TensorView& t, const std::string& who);

// An owning tensor for outputs.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  // Zero-filled, or a copy of src's bytes.
  static Tensor make(DType dtype, std::vector<int64_t> shape, const void* src = nullptr);
  static Tensor f32(std::vector<int64_t> shape, const float* src = nullptr) { return make(DType::F32, std::move(shape), src); }
  static Tensor i64(std::vector<int64_t> shape, const int64_t* src = nullptr) { return make(DType::I64, std::move(shape), src); }
  float* f32_data() { return reinterpret_cast<float*>(bytes.data()); }
  const float* f32_data() const { return reinterpret_cast<const float*>(bytes.data()); }
  TensorView view(std::string name = {}) const { return {dtype, shape, bytes.data(), std::move(name)}; }
};

}  // namespace alpamayo
