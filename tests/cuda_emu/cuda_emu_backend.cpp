// Registers the test-only backend `cuda_emu`: the cuda backend's own registry entry (its formats and every
// capability it states), built from the same sources over the fake runtime, with its name, loader and probe
// replaced. The conformance suite then runs it like any registered backend, on any machine.
#include "alpamayo/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_model.h"

namespace alpamayo::cuda_emu {
namespace {

const bool registered = [] {
  BackendInfo info = backend_info();
  info.name = "cuda_emu";
  info.load = load_backend;
  info.unavailable = [] { return std::string(); };  // the emulator runs anywhere
  register_backend(std::move(info));
  return true;
}();

}  // namespace
}  // namespace alpamayo::cuda_emu
