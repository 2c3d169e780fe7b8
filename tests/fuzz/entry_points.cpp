#include "entry_points.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "alpamayo/checkpoint.h"
#include "alpamayo/context.h"
#include "alpamayo/error.h"
#include "alpamayo/safetensors.h"
#include "alpamayo/synthetic.h"

namespace fs = std::filesystem;

namespace alpamayo::fuzz {
namespace {

// Tiny checkpoints (single-file A2 and R1, sharded A2) and a scratch directory, made once per process.
struct Fixture {
  fs::path root, a2, r1, sharded, scratch;
  ExpertConfig cfg;

  Fixture() {
    const char* shm = "/dev/shm";
    const fs::path base = fs::is_directory(shm) && access(shm, W_OK) == 0 ? fs::path(shm) : fs::temp_directory_path();
    remove_stale(base);
    root = base / ("alpamayo-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(root);
    SyntheticCheckpointSpec s;
    s.L = 2; s.D = 16; s.Hq = 2; s.Hkv = 1; s.d = 8; s.I = 24; s.ain_hidden = 8; s.ain_layers = 1; s.n_fourier = 4; s.T = 4;
    s.dtype = DType::F32;
    a2 = root / "a2";
    write_synthetic_checkpoint(a2.string(), s);
    s.layout = Layout::R1;
    r1 = root / "r1";
    write_synthetic_checkpoint(r1.string(), s);
    s.layout = Layout::A2;
    s.shards = 3;
    sharded = root / "sharded" / "ck";
    write_synthetic_checkpoint(sharded.string(), s);
    // A valid shard outside the checkpoint directory: an index that escapes would load it.
    fs::copy_file(sharded / "model-00001-of-00004.safetensors", root / "sharded" / "outside.safetensors");
    scratch = root / "scratch";
    fs::create_directories(scratch);
    cfg = Checkpoint::open(a2.string())->config();
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  // Fixtures of processes that ended without running destructors (libFuzzer exits with _Exit on a finding
  // or a timeout).
  static void remove_stale(const fs::path& base) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(base, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("alpamayo-fuzz-", 0) != 0) continue;
      const int pid = std::atoi(n.c_str() + 14);
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
    }
  }
  static Fixture& get() {
    static Fixture f;
    return f;
  }
};

void write_file(const fs::path& p, const uint8_t* data, size_t size) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  while (size > 0) {
    const ssize_t r = ::write(fd, data, size);
    if (r <= 0) std::abort();
    data += r;
    size -= static_cast<size_t>(r);
  }
  ::close(fd);
}

void invariant(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

void safetensors_header(const uint8_t* data, size_t size) {
  try {
    const SafetensorsFile f = SafetensorsFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
    uint64_t n = 0;
    std::memcpy(&n, data, 8);
    uint64_t covered = 0;
    for (const auto& [key, ti] : f.tensors()) {
      const TensorView v = f.view(key);
      const auto* p = static_cast<const uint8_t*>(v.data);
      invariant(ti.begin <= ti.end && ti.end <= size - 8 - n && ti.end - ti.begin == v.nbytes(), "a view outside the file");
      // Reads stay inside the image (ASan would see an overflow of the copy).
      volatile uint8_t sink = 0;
      if (v.nbytes() > 0) sink = sink + p[0] + p[v.nbytes() - 1];
      if (is_float(v.dtype) && v.numel() <= (1 << 16)) (void)to_f32(v);
      covered += v.nbytes();
    }
    invariant(8 + n + covered == size, "the tensors do not tile the data section");
  } catch (const Error&) {
  }
}

void config_json(const uint8_t* data, size_t size) {
  Fixture& fx = Fixture::get();
  for (const fs::path& dir : {fx.a2, fx.r1}) {
    write_file(dir / "config.json", data, size);
    try {
      (void)Checkpoint::open(dir.string());
    } catch (const Error&) {
    }
  }
  const fs::path vlm = fx.scratch / "vlm_config.json";
  write_file(vlm, data, size);
  try {
    (void)Checkpoint::open(fx.sharded.string(), vlm.string());
  } catch (const Error&) {
  }
}

void shard_index(const uint8_t* data, size_t size) {
  Fixture& fx = Fixture::get();
  write_file(fx.sharded / "model.safetensors.index.json", data, size);
  try {
    const auto ck = Checkpoint::open(fx.sharded.string());
    const std::string prefix = fx.sharded.string() + "/";
    for (const std::string& f : ck->files()) {
      invariant(f.compare(0, prefix.size(), prefix) == 0, "a shard outside the checkpoint directory was opened");
      for (const auto& part : fs::path(f.substr(prefix.size())))
        invariant(part != ".." && part != ".", "a shard path with '..' or '.' was opened");
    }
  } catch (const Error&) {
  }
}

void context_file(const uint8_t* data, size_t size) {
  Fixture& fx = Fixture::get();
  const fs::path p = fx.scratch / "context.safetensors";
  write_file(p, data, size);
  try {
    const Context c = Context::open(p.string());
    c.check_compatible(fx.cfg);
  } catch (const Error&) {
  }
}

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {{"safetensors_header", safetensors_header},
                                        {"config_json", config_json},
                                        {"shard_index", shard_index},
                                        {"context", context_file}};
  return t;
}

}  // namespace alpamayo::fuzz
