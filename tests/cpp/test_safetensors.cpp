#include <cmath>
#include <fstream>

#include "test_util.h"

namespace alpamayo {
namespace {
using test::expect_error;
using test::TempDir;

void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t header_len = -1) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f << std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripAllFloatDtypesAndMetadata) {
  TempDir tmp;
  std::vector<float> a = {1.f, -2.5f, 3.25f, 0.f, 1e-3f, 7.f};
  std::vector<uint16_t> b(6), h(6);
  convert_to_bf16({DType::F32, {6}, a.data(), ""}, b.data());
  for (int i = 0; i < 6; ++i) h[i] = f32_to_f16(a[i]);
  int64_t scalar = -42;
  write_safetensors(tmp / "x.safetensors",
                    {{"a", {DType::F32, {2, 3}, a.data(), ""}}, {"b", {DType::BF16, {3, 2}, b.data(), ""}},
                     {"h", {DType::F16, {6}, h.data(), ""}}, {"s", {DType::I64, {}, &scalar, ""}}},
                    {{"format", "pt"}});
  SafetensorsFile f(tmp / "x.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.view("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_f32(f.view("a")), a);
  const std::vector<float> bb = to_f32(f.view("b")), hh = to_f32(f.view("h"));
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(bb[i], a[i], std::abs(a[i]) * 4e-3);
    EXPECT_NEAR(hh[i], a[i], std::abs(a[i]) * 1e-3);
  }
  EXPECT_EQ(*static_cast<const int64_t*>(f.view("s").data), -42);
  EXPECT_TRUE(f.view("s").shape.empty());
  expect_error([&] { f.view("nope"); }, {"x.safetensors", "missing tensor 'nope'"});
  // Atomic write leaves no temporary files behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(tmp.path())) { (void)e; ++files; }
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, ConversionsRoundLikeTorch) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_round(59.94842529296875f), 60.0f);          // the release's rounded Fourier frequency
  EXPECT_EQ(bf16_round(1.0f + 1.0f / 256), 1.0f);            // tie -> even
  EXPECT_EQ(bf16_round(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.f)), 65504.f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.960464477539063e-08f)), 5.960464477539063e-08f);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(-0.333251953125f)), -0.333251953125f);
  for (float v : {0.1f, -3.7f, 1e-4f, 1234.5f}) EXPECT_NEAR(f16_to_f32(f32_to_f16(v)), v, std::abs(v) * 1e-3);
}

TEST(Safetensors, RejectsTruncatedAndCorruptFiles) {
  TempDir tmp;
  {
    std::ofstream f(tmp / "short.safetensors", std::ios::binary);
    f << "abc";
  }
  expect_error([&] { SafetensorsFile(tmp / "short.safetensors"); }, {"short.safetensors", "truncated"});
  write_raw(tmp / "len.safetensors", "{}", 0, 1000);
  expect_error([&] { SafetensorsFile(tmp / "len.safetensors"); }, {"len.safetensors", "header length 1000"});
  write_raw(tmp / "json.safetensors", "{\"a\": [", 0);
  expect_error([&] { SafetensorsFile(tmp / "json.safetensors"); }, {"json.safetensors", "invalid JSON"});
  write_raw(tmp / "range.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_error([&] { SafetensorsFile(tmp / "range.safetensors"); }, {"range.safetensors", "'w'", "out of range"});
  write_raw(tmp / "size.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
  expect_error([&] { SafetensorsFile(tmp / "size.safetensors"); }, {"'w'", "expected 12"});
  write_raw(tmp / "dtype.safetensors", R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,4]}})", 4);
  expect_error([&] { SafetensorsFile(tmp / "dtype.safetensors"); }, {"'w'", "unknown dtype"});
  write_raw(tmp / "rev.safetensors", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4);
  expect_error([&] { SafetensorsFile(tmp / "rev.safetensors"); }, {"'w'", "reversed"});
  write_raw(tmp / "neg.safetensors", R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0);
  expect_error([&] { SafetensorsFile(tmp / "neg.safetensors"); }, {"'w'", "invalid shape"});
  expect_error([&] { SafetensorsFile(tmp / "absent.safetensors"); }, {"absent.safetensors", "cannot open"});
}

TEST(Safetensors, FailedWriteLeavesNothing) {
  TempDir tmp;
  float x = 1.f;
  expect_error([&] { write_safetensors(tmp / "no/such/dir/x.safetensors", {{"x", {DType::F32, {1}, &x, ""}}}); },
               {"x.safetensors", "does not exist"});
  expect_error([&] {
    write_safetensors_stream(tmp / "y.safetensors", {{"x", {DType::F32, {1}, nullptr, ""}}},
                             [](size_t, void*) { throw Error("fill failed"); });
  }, {"fill failed"});
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

}  // namespace
}  // namespace alpamayo
