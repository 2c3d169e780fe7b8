// Replays the committed fuzz corpora (tests/fuzz/corpus/<target>/, minimized by libFuzzer, plus the seeds)
// through the same entry points as the libFuzzer targets, so every CI run re-checks them without clang.
// An input fails the test if it throws anything but alpamayo::Error (the entry points catch that) or breaks
// an invariant (abort).
#include <fstream>

#include "entry_points.h"
#include "test_util.h"

namespace alpamayo {
namespace fuzz {
void PrintTo(const Target& t, std::ostream* os) { *os << t.name; }
}  // namespace fuzz
namespace {
namespace fs = std::filesystem;

class FuzzCorpus : public testing::TestWithParam<fuzz::Target> {};

TEST_P(FuzzCorpus, EveryInputParsesOrFailsWithAnError) {
  const fuzz::Target& t = GetParam();
  int n = 0;
  for (const char* kind : {"corpus", "seeds"}) {
    const fs::path dir = fs::path(ALPAMAYO_SOURCE_DIR) / "tests/fuzz" / kind / t.name;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::ifstream f(e.path(), std::ios::binary);
      const std::string bytes(std::istreambuf_iterator<char>(f), {});
      SCOPED_TRACE(e.path().string());
      try {
        t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      } catch (const std::exception& ex) {
        ADD_FAILURE() << e.path() << ": " << typeid(ex).name() << ": " << ex.what();
      }
      ++n;
    }
  }
  EXPECT_GE(n, 3) << "no corpus for " << t.name;
  RecordProperty("inputs", n);
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpus, testing::ValuesIn(fuzz::targets()),
                         [](const testing::TestParamInfo<fuzz::Target>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace alpamayo
