// libFuzzer target: see entry_points.h.
#include "entry_points.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  alpamayo::fuzz::context_file(data, size);
  return 0;
}
