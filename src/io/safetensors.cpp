#include "alpamayo/safetensors.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "alpamayo/error.h"
#include "io/inputs.h"
#include "io/mapped_file.h"

namespace alpamayo {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit (100 MB), rounded up
constexpr int kMaxHeaderDepth = 8;              // a valid header nests 3 deep

// A JSON value for a message, cut short.
std::string brief(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 120) s = s.substr(0, 120) + "...";
  return s;
}

// What a file that is not safetensors seems to be, from its first bytes.
std::string describe_start(const uint8_t* p, size_t n) {
  auto starts = [&](const char* magic, size_t len) { return n >= len && std::memcmp(p, magic, len) == 0; };
  std::string kind;
  if (starts("PK\x03\x04", 4)) kind = "a zip archive, e.g. a PyTorch .pt/.bin file";
  else if (starts("GGUF", 4)) kind = "a GGUF file";
  else if (starts("\x89HDF\r\n\x1a\n", 8)) kind = "an HDF5 file";
  else if (starts("\x93NUMPY", 6)) kind = "a NumPy .npy file";
  else if (n >= 2 && p[0] == 0x80 && p[1] <= 5) kind = "a Python pickle";
  else if (n > 0 && std::all_of(p, p + std::min<size_t>(n, 8), [](uint8_t c) { return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\r' || c == '\t'; }))
    kind = (p[0] == '{' || p[0] == '[') ? "JSON text" : "text";
  static const char hex[] = "0123456789abcdef";
  std::string bytes;
  for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
    if (i) bytes += ' ';
    bytes += hex[p[i] >> 4];
    bytes += hex[p[i] & 15];
  }
  return (kind.empty() ? "" : " (it looks like " + kind + ")") + std::string(": a safetensors file starts with an 8-byte "
         "little-endian header length and a JSON header, this one starts with the bytes ") + bytes + " ('" +
         quote_untrusted(std::string(reinterpret_cast<const char*>(p), std::min<size_t>(n, 16)), 40) + "')";
}

// One tensor's header entry: dtype, shape (element count without overflow) and data offsets within the data section.
TensorInfo parse_entry(const std::string& where, const nlohmann::json& v, uint64_t data_size) {
  check(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), ErrorCode::Format,
        where + ": header entry needs dtype, shape and data_offsets");
  TensorInfo ti;
  check(v["dtype"].is_string() && parse_dtype(v["dtype"].get<std::string>(), &ti.dtype), ErrorCode::Format,
        where + ": unknown dtype " + brief(v["dtype"]));
  check(v["shape"].is_array(), ErrorCode::Format, where + ": shape must be an array");
  // Element count folded left to right with overflow checks, as the reference does; every partial
  // product stays within int64 so TensorView::numel() cannot overflow either.
  uint64_t numel = 1;
  for (const auto& s : v["shape"]) {
    check(s.is_number_unsigned(), ErrorCode::Format,
          where + ": invalid shape " + brief(v["shape"]) + " (dimensions must be non-negative integers)");
    const auto dim = s.get<uint64_t>();
    check(!__builtin_mul_overflow(numel, dim, &numel) && numel <= uint64_t(INT64_MAX) && dim <= uint64_t(INT64_MAX),
          ErrorCode::Format, where + ": shape " + brief(v["shape"]) + " has more than 2^63 elements");
    ti.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t want = 0;
  check(!__builtin_mul_overflow(numel, uint64_t(dtype_size(ti.dtype)), &want), ErrorCode::Format,
        where + ": shape " + brief(v["shape"]) + " of " + dtype_name(ti.dtype) + " needs more than 2^64 bytes");
  const auto& off = v["data_offsets"];
  check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
        ErrorCode::Format, where + ": data_offsets must be two non-negative integers, found " + brief(off));
  ti.begin = off[0].get<uint64_t>();
  ti.end = off[1].get<uint64_t>();
  check(ti.begin <= ti.end, ErrorCode::Format, where + ": data_offsets " + brief(off) + " are reversed");
  check(ti.end <= data_size, ErrorCode::Format,
        where + ": data_offsets " + brief(off) + " out of range: the data section has " + std::to_string(data_size) +
            " bytes (file truncated?)");
  check(ti.end - ti.begin == want, ErrorCode::Format,
        where + ": " + std::to_string(ti.end - ti.begin) + " bytes for shape " + shape_str(ti.shape) + " " +
            dtype_name(ti.dtype) + ", expected " + std::to_string(want));
  return ti;
}

// The tensors' data must tile the data section exactly: sorted by offsets, each starts where the previous ends,
// and the last ends at the end of the file (no gaps, overlaps or trailing bytes).
void check_tiling(const std::string& path, const std::map<std::string, TensorInfo>& tensors, uint64_t data_size) {
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [k, ti] : tensors) order.push_back({&k, &ti});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  uint64_t at = 0;
  const std::string* prev = nullptr;
  for (const auto& [k, ti] : order) {
    if (ti->begin != at) {
      const std::string where = path + ": tensor '" + quote_untrusted(*k) + "': data starts at byte " + std::to_string(ti->begin);
      const std::string after = prev ? " but the previous tensor '" + quote_untrusted(*prev) + "' ends at byte " + std::to_string(at)
                                     : " but the first tensor must start at byte 0";
      throw Error(ErrorCode::Format, where + after + (ti->begin < at ? " (overlapping data)" : " (a gap)") +
                                         "; data offsets must tile the data section");
    }
    at = ti->end;
    prev = k;
  }
  check(at == data_size, ErrorCode::Format,
        path + ": " + std::to_string(data_size - at) +
            " trailing bytes after the last tensor's data (the data section has " + std::to_string(data_size) +
            " bytes, the tensors cover " + std::to_string(at) + ")");
}

}  // namespace

struct SafetensorsFile::AlignedCopies {
  std::mutex mutex;
  std::map<std::string, std::vector<uint64_t>> copies;
};

SafetensorsFile::SafetensorsFile(const std::string& path)
    : path_(path), map_(std::make_unique<MappedFile>(path)), aligned_(std::make_unique<AlignedCopies>()) {
  try {
    parse();
  } catch (const Error&) {
    map_->check_intact();  // a file truncated while being read: say so rather than "corrupt"
    throw;
  }
  map_->check_intact();
}

SafetensorsFile SafetensorsFile::from_bytes(std::string bytes, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  f.map_ = std::make_unique<MappedFile>(std::move(bytes), name);
  f.aligned_ = std::make_unique<AlignedCopies>();
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string& path = path_;
  const uint8_t* const base = map_->data();
  const size_t size = map_->size();
  check(size >= 8, ErrorCode::Format,
        path + ": truncated safetensors file (" + std::to_string(size) +
            " bytes, expected at least 8 for the header length)");
  uint64_t n = 0;
  std::memcpy(&n, base, 8);  // little-endian on every supported target
  const bool json_follows = size > 8 && base[8] == '{';
  if (json_follows && n <= kMaxHeader && n > size - 8)
    throw Error(ErrorCode::Format, path + ": truncated safetensors file: header length " + std::to_string(n) +
                                       " but only " + std::to_string(size - 8) + " bytes follow");
  check(json_follows && n >= 2 && n <= kMaxHeader && n <= size - 8, ErrorCode::Format,
        path + ": not a safetensors file" + describe_start(base, size));
  const char* hb = reinterpret_cast<const char*>(base + 8);
  const nlohmann::json header = parse_json_strict(hb, hb + n, path + ": corrupt safetensors header", kMaxHeaderDepth);
  check(header.is_object(), ErrorCode::Format, path + ": corrupt safetensors header: expected a JSON object");
  const uint64_t data_size = size - 8 - n;
  data_start_ = 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      check(v.is_object(), ErrorCode::Format, path + ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        check(m.value().is_string(), ErrorCode::Format,
              path + ": __metadata__ key '" + quote_untrusted(m.key()) + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + quote_untrusted(key) + "'";
    tensors_.emplace(key, parse_entry(where, v, data_size));
  }
  check_tiling(path, tensors_, data_size);
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const TensorInfo& SafetensorsFile::info(const std::string& key) const {
  auto it = tensors_.find(key);
  check(it != tensors_.end(), ErrorCode::Format, path_ + ": missing tensor '" + key + "'");
  return it->second;
}

TensorView SafetensorsFile::view(const std::string& key) const {
  const TensorInfo& ti = info(key);
  const uint8_t* p = map_->data() + data_start_ + ti.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(ti.dtype) != 0) {  // valid, but typed reads need alignment
    std::lock_guard<std::mutex> lock(aligned_->mutex);
    std::vector<uint64_t>& copy = aligned_->copies[key];
    const size_t nb = ti.end - ti.begin;
    if (copy.empty() && nb > 0) {
      copy.resize((nb + 7) / 8);
      std::memcpy(copy.data(), p, nb);
    }
    p = reinterpret_cast<const uint8_t*>(copy.data());
  }
  return {ti.dtype, ti.shape, p, path_ + ": " + key};
}

void SafetensorsFile::check_intact() const { map_->check_intact(); }

namespace {

// The order the data are written in: by decreasing element size (stable), as the reference writer does,
// so that after the 8-byte aligned header every tensor is aligned to its element size.
std::vector<size_t> data_order(const std::vector<NamedTensor>& specs) {
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(specs[a].tensor.dtype) > dtype_size(specs[b].tensor.dtype);
  });
  return order;
}

// The header of a file holding specs in data_order(), padded so the data section starts 8-byte aligned.
std::string header_bytes(const std::vector<NamedTensor>& specs, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (size_t i : data_order(specs)) {
    const NamedTensor& t = specs[i];
    check(t.name != "__metadata__" && !header.contains(t.name), "safetensors writer: duplicate tensor name '" + t.name + "'");
    const uint64_t nb = t.tensor.nbytes();
    header[t.name] = {{"dtype", dtype_name(t.tensor.dtype)}, {"shape", t.tensor.shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string hs = header.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');
  const uint64_t n = hs.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + hs;
}

}  // namespace

uint64_t safetensors_file_size(const std::vector<NamedTensor>& specs, const std::map<std::string, std::string>& metadata) {
  uint64_t n = header_bytes(specs, metadata).size();
  for (const NamedTensor& t : specs) n += t.tensor.nbytes();
  return n;
}

void serialize_safetensors_stream(const ByteSink& sink, const std::vector<NamedTensor>& specs,
                                  const std::function<void(size_t, void*)>& fill,
                                  const std::map<std::string, std::string>& metadata) {
  const std::string h = header_bytes(specs, metadata);
  sink(h.data(), h.size());
  std::vector<uint8_t> buf;
  for (size_t i : data_order(specs)) {
    buf.resize(specs[i].tensor.nbytes());
    fill(i, buf.data());
    sink(buf.data(), buf.size());
  }
}

void serialize_safetensors(const ByteSink& sink, const std::vector<NamedTensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  const std::string h = header_bytes(tensors, metadata);
  sink(h.data(), h.size());
  for (size_t i : data_order(tensors)) sink(tensors[i].tensor.data, tensors[i].tensor.nbytes());
}

void write_safetensors_stream(const std::string& path, const std::vector<NamedTensor>& specs,
                              const std::function<void(size_t, void*)>& fill,
                              const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, [&](const ByteSink& sink) { serialize_safetensors_stream(sink, specs, fill, metadata); });
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, [&](const ByteSink& sink) { serialize_safetensors(sink, tensors, metadata); });
}

void write_text_file(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

}  // namespace alpamayo
