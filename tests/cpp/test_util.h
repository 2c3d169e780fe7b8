// Shared helpers for the GoogleTest suite: temporary directories and safetensors rewriting.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <cstdlib>
#include <random>
#include <string>

#include "alpamayo/error.h"
#include "alpamayo/safetensors.h"
#include "alpamayo/synthetic.h"

namespace alpamayo::test {

class TempDir {
 public:
  TempDir() {
    static std::mt19937_64 rng(std::random_device{}());
    path_ = std::filesystem::temp_directory_path() / ("alpamayo-test-" + std::to_string(rng()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Sets an environment variable for a scope, restoring its earlier value (or absence) at the end.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* v = std::getenv(name_.c_str())) old_ = v;
    set(value);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  void set(const std::string& value) { setenv(name_.c_str(), value.c_str(), 1); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Expects fn to throw alpamayo::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an alpamayo::Error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
  }
}

// Owned copy of a safetensors file's tensors, to edit and write back.
struct TensorSet {
  std::vector<std::string> names;
  std::map<std::string, Tensor> t;

  static TensorSet read(const std::string& path) {
    SafetensorsFile f(path);
    TensorSet s;
    for (const auto& [k, ti] : f.tensors()) {
      TensorView v = f.view(k);
      Tensor o;
      o.dtype = v.dtype;
      o.shape = v.shape;
      o.bytes.assign(static_cast<const uint8_t*>(v.data), static_cast<const uint8_t*>(v.data) + v.nbytes());
      s.names.push_back(k);
      s.t[k] = std::move(o);
    }
    return s;
  }
  void write(const std::string& path) const {
    std::vector<NamedTensor> nt;
    for (const auto& n : names)
      if (t.count(n)) nt.push_back({n, t.at(n).view()});
    write_safetensors(path, nt);
  }
  void erase(const std::string& n) { t.erase(n); }
};

inline SyntheticCheckpointSpec tiny_spec(Layout layout = Layout::A2) {
  SyntheticCheckpointSpec s;
  s.layout = layout;
  s.L = 2; s.D = 64; s.Hq = 4; s.Hkv = 2; s.d = 16; s.I = 128; s.ain_hidden = 32; s.T = 8;
  return s;
}

// A tiny checkpoint of the given release (its config.json shape and tensor layout).
inline SyntheticCheckpointSpec tiny_spec(Release release) {
  SyntheticCheckpointSpec s = tiny_spec(release_layout(release));
  s.release = release;
  return s;
}

}  // namespace alpamayo::test
