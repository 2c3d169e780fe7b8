// A C++ consumer of the installed static library (the cxx component): the same sample as main.c through the
// C++ API, printed the same way.
//   consumer_cxx CHECKPOINT_DIR CONTEXT_FILE
#include <cstdio>

#include "alpamayo/engine.h"
#include "alpamayo/error.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  try {
    auto model = alpamayo::Model::load(alpamayo::Checkpoint::open(argv[1]));
    alpamayo::Session session(model);
    session.bind(alpamayo::Context::open(argv[2]));
    const alpamayo::SampleResult r = session.sample({.seed = 7});
    std::printf("%s xyz", model->backend_name().c_str());
    for (float v : r.xyz) std::printf(" %a", v);
    std::printf("\n");
  } catch (const alpamayo::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
