// A small safetensors reader (memory-mapped, header fully validated) and an atomic writer.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// optional "__metadata__" {str: str}, then the data; offsets are relative to the data start.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "alpamayo/output.h"
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
  // Maps the file (a regular file only: pipes and devices are refused before they are opened) and
  // validates the header as strictly as the reference implementation: JSON syntax and UTF-8, no duplicate
  // keys, known dtypes, non-negative shapes whose byte size does not overflow, byte sizes matching shapes,
  // and data offsets that tile the data section exactly (no gaps, overlaps or trailing bytes). Throws
  // Error naming the file and the offending key.
  explicit SafetensorsFile(const std::string& path);
  // The same over an in-memory image; name is used in messages.
  static SafetensorsFile from_bytes(std::string bytes, const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const { return path_; }
  bool contains(const std::string& key) const { return tensors_.count(key) != 0; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Throws Error("<file>: missing tensor '<key>'") when absent.
  const TensorInfo& info(const std::string& key) const;
  // A view into the mapping (valid while this object lives); name is "<file>: <key>". The format does
  // not require aligned data: a tensor whose data is not aligned to its element size is copied once into
  // an aligned buffer, so views are always aligned.
  TensorView view(const std::string& key) const;

  // Throws Error naming the file if it was truncated or modified since it was opened. A mapped file that
  // is truncated under a run never kills the process: the reads see zeros and this check reports it
  // (see also check_mapped_files()).
  void check_intact() const;

 private:
  SafetensorsFile() = default;
  void parse();
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  struct AlignedCopies;
  std::unique_ptr<AlignedCopies> aligned_;
};

struct NamedTensor {
  std::string name;
  TensorView tensor;
};

// Throws Error naming the first safetensors file alive in the process (checkpoint shards, contexts, noise)
// that was truncated or modified since it was opened. Called by OutputSet::commit() before anything is
// written.
void check_mapped_files();

// Writes the safetensors bytes of specs (data from fill(i, dst), which gets nbytes of tensor i) to sink.
// As the reference writer does, the data are laid out by decreasing element size after an 8-byte aligned
// header, so every tensor is aligned to its element size.
// The size in bytes of the file serialize_safetensors_stream writes for specs and metadata.
uint64_t safetensors_file_size(const std::vector<NamedTensor>& specs, const std::map<std::string, std::string>& metadata = {});
void serialize_safetensors_stream(const ByteSink& sink, const std::vector<NamedTensor>& specs,
                                  const std::function<void(size_t, void*)>& fill,
                                  const std::map<std::string, std::string>& metadata = {});
void serialize_safetensors(const ByteSink& sink, const std::vector<NamedTensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// Writes tensors to path atomically through OutputSet (output.h): an exclusive temporary file in the same
// directory, then rename, so a failure never leaves a half-written file behind.
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
