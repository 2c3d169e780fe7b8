// Conversion speed of the bfp8_b / bfp4_b module (single thread), on one [1536, 4096] matrix (the expert's
// wqkv shape, 6.3 M values). Bytes processed count the fp32 side (4 bytes per value; 2 for bf16 input), so
// MB/s here is fp32 megabytes converted per second.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "alpamayo/bfp.h"
#include "alpamayo/tensor.h"

using namespace alpamayo;
using bfp::Format;

namespace {

constexpr int64_t kRows = 1536, kCols = 4096;

const std::vector<float>& matrix() {
  static const std::vector<float> m = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> v(static_cast<size_t>(kRows * kCols));
    for (float& x : v) x = normal(rng);
    return v;
  }();
  return m;
}

Format fmt(const benchmark::State& st) { return st.range(0) == 8 ? Format::Bfp8_b : Format::Bfp4_b; }

void finish(benchmark::State& st, size_t bytes_per_value) {
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * kRows * kCols * static_cast<int64_t>(bytes_per_value));
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * kRows * kCols);
  st.SetLabel(st.range(0) == 8 ? "bfp8_b" : "bfp4_b");
}

void BM_PackMatrix(benchmark::State& st) {
  const auto& m = matrix();
  for (auto _ : st) benchmark::DoNotOptimize(bfp::pack_matrix(fmt(st), m.data(), kRows, kCols).bytes.data());
  finish(st, 4);
}

void BM_PackMatrixBf16(benchmark::State& st) {
  std::vector<uint16_t> h(matrix().size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(matrix()[i]);
  for (auto _ : st) benchmark::DoNotOptimize(bfp::pack_matrix_bf16(fmt(st), h.data(), kRows, kCols).bytes.data());
  finish(st, 2);
}

void BM_UnpackMatrix(benchmark::State& st) {
  const auto pm = bfp::pack_matrix(fmt(st), matrix().data(), kRows, kCols);
  std::vector<float> out(matrix().size());
  for (auto _ : st) {
    pm.unpack(out.data());
    benchmark::ClobberMemory();
  }
  finish(st, 4);
}

void BM_PackTilesFaceOrder(benchmark::State& st) {
  const size_t tiles = matrix().size() / 1024;
  std::vector<uint8_t> out(tiles * bfp::tile_bytes(fmt(st)));
  for (auto _ : st) {
    bfp::pack_tiles(fmt(st), matrix().data(), tiles, false, out.data());
    benchmark::ClobberMemory();
  }
  finish(st, 4);
}

void BM_UnpackTilesFaceOrder(benchmark::State& st) {
  const size_t tiles = matrix().size() / 1024;
  std::vector<uint8_t> packed(tiles * bfp::tile_bytes(fmt(st)));
  bfp::pack_tiles(fmt(st), matrix().data(), tiles, false, packed.data());
  std::vector<float> out(matrix().size());
  for (auto _ : st) {
    bfp::unpack_tiles(fmt(st), packed.data(), tiles, false, out.data());
    benchmark::ClobberMemory();
  }
  finish(st, 4);
}

void BM_QuantizeInPlace(benchmark::State& st) {
  std::vector<float> work(matrix().size());
  for (auto _ : st) {
    st.PauseTiming();
    work = matrix();
    st.ResumeTiming();
    bfp::quantize_matrix(fmt(st), work.data(), kRows, kCols);
    benchmark::ClobberMemory();
  }
  finish(st, 4);
}

}  // namespace

BENCHMARK(BM_PackMatrix)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackMatrixBf16)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_UnpackMatrix)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackTilesFaceOrder)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_UnpackTilesFaceOrder)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_QuantizeInPlace)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
