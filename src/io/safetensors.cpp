#include "alpamayo/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpamayo/error.h"

namespace alpamayo {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY);
    check(fd_ >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error(path + ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (data_ == MAP_FAILED) {
        ::close(fd_);
        throw Error(path + ": mmap failed (" + std::strerror(errno) + ")");
      }
    }
  }
  ~MappedFile() {
    if (data_ && data_ != MAP_FAILED) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  void* data_ = nullptr;
  size_t size_ = 0;
};

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(std::make_unique<MappedFile>(path)) {
  const size_t size = map_->size();
  check(size >= 8, path + ": truncated safetensors file (" + std::to_string(size) +
                       " bytes, expected at least 8 for the header length)");
  uint64_t n = 0;
  std::memcpy(&n, map_->data(), 8);  // little-endian on every supported target
  check(n <= kMaxHeader, path + ": corrupt safetensors header: header length " + std::to_string(n) +
                             " exceeds the 100 MiB limit");
  check(n <= size - 8, path + ": truncated safetensors file: header length " + std::to_string(n) +
                           " but only " + std::to_string(size - 8) + " bytes follow");
  const char* hb = reinterpret_cast<const char*>(map_->data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hb, hb + n);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": corrupt safetensors header: invalid JSON (" + e.what() + ")");
  }
  check(header.is_object(), path + ": corrupt safetensors header: expected a JSON object");
  const uint64_t data_size = size - 8 - n;
  data_start_ = 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      check(v.is_object(), path + ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        check(m.value().is_string(), path + ": __metadata__ key '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + key + "'";
    check(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
          where + ": header entry needs dtype, shape and data_offsets");
    TensorInfo ti;
    check(v["dtype"].is_string() && parse_dtype(v["dtype"].get<std::string>(), &ti.dtype),
          where + ": unknown dtype " + v["dtype"].dump());
    check(v["shape"].is_array(), where + ": shape must be an array");
    uint64_t numel = 1;
    for (const auto& s : v["shape"]) {
      check(s.is_number_integer() && s.get<int64_t>() >= 0, where + ": invalid shape " + v["shape"].dump());
      const auto dim = s.get<uint64_t>();
      check(dim == 0 || numel <= (1ull << 62) / dim, where + ": shape too large " + v["shape"].dump());
      numel *= dim;
      ti.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
          where + ": data_offsets must be two non-negative integers, found " + off.dump());
    ti.begin = off[0].get<uint64_t>();
    ti.end = off[1].get<uint64_t>();
    check(ti.begin <= ti.end, where + ": data_offsets " + off.dump() + " are reversed");
    check(ti.end <= data_size, where + ": data_offsets " + off.dump() + " out of range: the data section has " +
                                   std::to_string(data_size) + " bytes (file truncated?)");
    const uint64_t want = numel * dtype_size(ti.dtype);
    check(ti.end - ti.begin == want, where + ": " + std::to_string(ti.end - ti.begin) + " bytes for shape " +
                                         shape_str(ti.shape) + " " + dtype_name(ti.dtype) + ", expected " +
                                         std::to_string(want));
    tensors_.emplace(key, std::move(ti));
  }
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const TensorInfo& SafetensorsFile::info(const std::string& key) const {
  auto it = tensors_.find(key);
  check(it != tensors_.end(), path_ + ": missing tensor '" + key + "'");
  return it->second;
}

TensorView SafetensorsFile::view(const std::string& key) const {
  const TensorInfo& ti = info(key);
  return {ti.dtype, ti.shape, map_->data() + data_start_ + ti.begin, path_ + ": " + key};
}

namespace {

// Writes bytes to a temporary sibling of `path` and renames it into place.
template <class WriteFn>
void atomic_write(const std::string& path, WriteFn write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    check(static_cast<bool>(f), path + ": cannot create (" + std::strerror(errno) + ")");
    try {
      write(f);
    } catch (...) {
      f.close();
      std::remove(tmp.c_str());
      throw;
    }
    f.flush();
    if (!f) {
      f.close();
      std::remove(tmp.c_str());
      throw Error(path + ": write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename temporary file into place (" + std::strerror(errno) + ")");
  }
}

}  // namespace

void write_safetensors_stream(const std::string& path, const std::vector<NamedTensor>& specs,
                              const std::function<void(size_t, void*)>& fill,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : specs) {
    const uint64_t nb = t.tensor.nbytes();
    header[t.name] = {{"dtype", dtype_name(t.tensor.dtype)}, {"shape", t.tensor.shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string hs = header.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  atomic_write(path, [&](std::ofstream& f) {
    const uint64_t n = hs.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < specs.size(); ++i) {
      buf.resize(specs[i].tensor.nbytes());
      fill(i, buf.data());
      f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
      check(static_cast<bool>(f), path + ": write failed (disk full?)");
    }
  });
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors_stream(
      path, tensors, [&](size_t i, void* dst) { std::memcpy(dst, tensors[i].tensor.data, tensors[i].tensor.nbytes()); },
      metadata);
}

void write_text_file(const std::string& path, const std::string& text) {
  atomic_write(path, [&](std::ofstream& f) { f.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

}  // namespace alpamayo
