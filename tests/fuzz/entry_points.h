// The entry points shared by the libFuzzer targets (fuzz_*.cpp, CMake option ALPAMAYO_FUZZ) and the
// corpus replay test (tests/cpp/test_fuzz_corpus.cpp). Each feeds one input to the library's public API;
// alpamayo::Error is the expected outcome of a bad input. Anything else (another exception, a crash, a
// sanitizer report, a broken invariant, which aborts) is a finding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace alpamayo::fuzz {

// The bytes of a safetensors file, parsed in memory; every view is touched and the data must tile the file.
void safetensors_header(const uint8_t* data, size_t size);
// The bytes of config.json for tiny single-file checkpoints of both layouts (Checkpoint::open), and the
// same bytes as --vlm-config of a valid sharded checkpoint.
void config_json(const uint8_t* data, size_t size);
// The bytes of model.safetensors.index.json of a tiny sharded checkpoint; every shard opened must be
// inside the checkpoint directory.
void shard_index(const uint8_t* data, size_t size);
// The bytes of a context file (Context::open, then check_compatible with the tiny checkpoint).
void context_file(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // corpus directory: tests/fuzz/corpus/<name>
  void (*run)(const uint8_t*, size_t);
};
const std::vector<Target>& targets();

}  // namespace alpamayo::fuzz
