// A small safetensors reader (memory-mapped, header fully validated) and an atomic writer.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// optional "__metadata__" {str: str}, then the data; offsets are relative to the data start.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/tensor.h"

namespace alpamayo {

struct TensorInfo {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class MappedFile;

class SafetensorsFile {
 public:
  // Maps the file and validates the header: JSON syntax, dtypes, shapes, offsets inside the file,
  // byte sizes matching shapes. Throws Error naming the file and the offending key.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const { return path_; }
  bool contains(const std::string& key) const { return tensors_.count(key) != 0; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Throws Error("<file>: missing tensor '<key>'") when absent.
  const TensorInfo& info(const std::string& key) const;
  // A view into the mapping (valid while this object lives); name is "<file>: <key>".
  TensorView view(const std::string& key) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct NamedTensor {
  std::string name;
  TensorView tensor;
};

// Writes tensors to path atomically: a temporary file in the same directory, then rename, so a
// failure never leaves a half-written file behind.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Streams tensors to path atomically without holding them all in memory: fill(i, dst) writes the
// bytes of tensor i (specs[i].tensor.data is ignored).
void write_safetensors_stream(const std::string& path, const std::vector<NamedTensor>& specs,
                              const std::function<void(size_t, void*)>& fill,
                              const std::map<std::string, std::string>& metadata = {});

// Writes a text file atomically (temporary file + rename).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace alpamayo
