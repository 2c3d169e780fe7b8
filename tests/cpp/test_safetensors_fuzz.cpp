// Mutation fuzzing of the safetensors reader: random truncations and byte edits of a valid file must
// either parse (and then give in-bounds views) or throw alpamayo::Error, never crash or read out of bounds.
#include <fstream>
#include <random>

#include "test_util.h"

namespace alpamayo {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(SafetensorsFuzz, MutatedFilesParseOrThrow) {
  test::TempDir tmp;
  std::vector<float> a(24, 1.5f);
  std::vector<uint16_t> b(10, 0x3f80);
  int64_t n = 7;
  write_safetensors(tmp / "ok.safetensors",
                    {{"weight", {DType::F32, {4, 6}, a.data(), ""}}, {"bias", {DType::BF16, {10}, b.data(), ""}},
                     {"n", {DType::I64, {1}, &n, ""}}},
                    {{"format", "pt"}});
  const std::string orig = slurp(tmp / "ok.safetensors");
  uint64_t hlen;
  std::memcpy(&hlen, orig.data(), 8);
  std::mt19937 rng(1234);
  int parsed = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string m = orig;
    const int kind = it % 4;
    if (kind == 0) {
      m.resize(rng() % (orig.size() + 1));  // truncation
    } else {
      const int edits = 1 + rng() % 4;
      for (int e = 0; e < edits; ++e) {
        // Mostly the header (length field + JSON), sometimes anywhere.
        const size_t pos = (rng() % 4) ? rng() % (8 + hlen) : rng() % m.size();
        static const char pool[] = "0123456789[]{},:\"-eE.FBIU \x00\xff";
        m[pos] = kind == 1 ? static_cast<char>(rng()) : pool[rng() % (sizeof(pool) - 1)];
      }
    }
    const std::string path = tmp / "m.safetensors";
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(m.data(), static_cast<std::streamsize>(m.size()));
    try {
      SafetensorsFile f(path);
      for (const auto& [k, ti] : f.tensors()) {
        const TensorView v = f.view(k);
        const auto* p = static_cast<const uint8_t*>(v.data);
        uint64_t sum = 0;
        for (size_t i = 0; i < v.nbytes(); ++i) sum += p[i];  // reads stay inside the mapping
        volatile uint64_t keep = sum;
        (void)keep;
      }
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(parsed, 10);  // edits to the data section or harmless JSON spacing still parse
}

}  // namespace
}  // namespace alpamayo
