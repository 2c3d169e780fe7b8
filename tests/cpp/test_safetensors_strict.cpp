// The safetensors reader is as strict as the reference implementation, opens regular files only (never
// blocking), survives files truncated under its mappings, and aligns views; the writer aligns data.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>

#include "alpamayo/checkpoint.h"
#include "alpamayo/context.h"
#include "alpamayo/output.h"
#include "io/inputs.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::expect_error;
using test::TempDir;
namespace fs = std::filesystem;

std::string image(const std::string& header, size_t data_bytes, int64_t header_len = -1) {
  const uint64_t n = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(data_bytes, '\0');
}

void expect_rejected(const std::string& header, size_t data_bytes, std::initializer_list<std::string> parts) {
  expect_error([&] { SafetensorsFile::from_bytes(image(header, data_bytes), "t.safetensors"); }, parts);
}

TEST(SafetensorsStrict, RejectsDuplicateKeys) {
  expect_rejected(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4,
                  {"t.safetensors", "duplicate key 'w'"});
  expect_rejected(R"({"__metadata__":{"a":"1"},"__metadata__":{"a":"2"}})", 0, {"duplicate key '__metadata__'"});
  expect_rejected(R"({"w":{"dtype":"U8","dtype":"F32","shape":[2],"data_offsets":[0,2]}})", 2, {"duplicate key 'dtype'"});
  expect_rejected(R"({"__metadata__":{"a":"1","a":"2"}})", 0, {"duplicate key 'a'"});
}

TEST(SafetensorsStrict, DataOffsetsMustTileTheDataSection) {
  // Overlapping.
  expect_rejected(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6,
                  {"'b'", "starts at byte 2", "'a' ends at byte 4", "overlapping"});
  // The same bytes twice.
  expect_rejected(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4,
                  {"overlapping"});
  // A gap, and a first tensor not at 0.
  expect_rejected(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6,
                  {"'b'", "a gap"});
  expect_rejected(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4, {"'a'", "start at byte 0"});
  // Trailing bytes, also with no tensors at all.
  expect_rejected(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5, {"3 trailing bytes"});
  expect_rejected(R"({})", 1, {"1 trailing bytes"});
  // Header order need not be data order (as in the reference, which sorts by offsets).
  const SafetensorsFile f = SafetensorsFile::from_bytes(
      image(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"a":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},"c":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 4),
      "ok");
  EXPECT_EQ(f.tensors().size(), 3u);
}

TEST(SafetensorsStrict, RejectsElementCountOverflow) {
  // 2^61 * 2 elements of 8 bytes: 2^65 bytes.
  expect_rejected(R"({"w":{"dtype":"F64","shape":[2305843009213693952,2],"data_offsets":[0,0]}})", 0, {"'w'", "more than 2^64 bytes"});
  expect_rejected(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0, {"'w'", "2^63 elements"});
  expect_rejected(R"({"w":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", 0, {"'w'", "2^63 elements"});
  expect_rejected(R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}})", 0, {"'w'", "invalid shape"});
  expect_rejected(R"({"w":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2, {"'w'", "invalid shape"});
  expect_rejected(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2.0]}})", 2, {"'w'", "data_offsets"});
}

TEST(SafetensorsStrict, NamesFilesThatAreNotSafetensors) {
  TempDir tmp;
  const std::string json = "{\n  \"architectures\": [\"AlpamayoR1\"]\n}\n";
  { std::ofstream(tmp / "config.safetensors") << json; }
  try {
    SafetensorsFile f(tmp / "config.safetensors");
    ADD_FAILURE() << "accepted a JSON file";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("config.safetensors: not a safetensors file (it looks like JSON text)"), std::string::npos) << m;
    EXPECT_NE(m.find("7b 0a 20 20 22 61 72 63"), std::string::npos) << m;
    uint64_t as_number;
    std::memcpy(&as_number, json.data(), 8);
    EXPECT_EQ(m.find(std::to_string(as_number)), std::string::npos) << "the first 8 bytes printed as a number: " << m;
  }
  expect_error([&] { SafetensorsFile::from_bytes(std::string("PK\x03\x04\x14\x00\x00\x00\x08\x00", 10), "model.bin"); },
               {"model.bin: not a safetensors file", "zip archive"});
  // A plausible length but no JSON object after it.
  expect_error([&] { SafetensorsFile::from_bytes(image(" {}", 0), "x"); }, {"x: not a safetensors file"});
  expect_error([&] { SafetensorsFile::from_bytes(image("", 0), "x"); }, {"x: not a safetensors file"});
  // Deep nesting is refused before anything walks it.
  expect_error([&] { SafetensorsFile::from_bytes(image("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0), "deep"); },
               {"deep", "nested more than"});
  // Control characters in keys are escaped in messages.
  expect_rejected("{\"\\u001b[31mx\":{\"dtype\":\"Q\",\"shape\":[],\"data_offsets\":[0,0]}}", 0, {"'\\x1b[31mx'", "unknown dtype"});
}

// Runs fn in a thread; fails (and unblocks the open by opening the pipe's other end) if it takes longer
// than a few seconds.
void expect_fails_fast(const std::string& fifo, const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  auto fut = std::async(std::launch::async, [&] { expect_error(fn, parts); });
  if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the named pipe " << fifo;
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    fut.wait();
    if (fd >= 0) ::close(fd);
  }
}

TEST(SafetensorsStrict, OpensRegularFilesOnlyWithoutBlocking) {
  TempDir tmp;
  const std::string fifo = tmp / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_fails_fast(fifo, [&] { SafetensorsFile f(fifo); }, {"pipe.safetensors", "is a named pipe, expected a regular file"});
  expect_fails_fast(fifo, [&] { Context::open(fifo); }, {"pipe.safetensors", "named pipe"});
  expect_fails_fast(fifo, [&] { read_json_file_strict(fifo); }, {"pipe.safetensors", "named pipe"});
  expect_error([&] { SafetensorsFile f(tmp.path().string()); }, {"is a directory, expected a regular file"});
  expect_error([&] { SafetensorsFile f("/dev/null"); }, {"/dev/null", "character device"});
  expect_error([&] { read_json_file_strict(tmp.path().string()); }, {"is a directory"});
  // A checkpoint whose config.json or shard is a pipe, or whose config.json is a directory.
  write_synthetic_checkpoint(tmp / "ck", test::tiny_spec());
  fs::rename(tmp / "ck/model.safetensors", tmp / "model.safetensors");
  ASSERT_EQ(::mkfifo((tmp / "ck/model.safetensors").c_str(), 0600), 0);
  expect_fails_fast(tmp / "ck/model.safetensors", [&] { Checkpoint::open(tmp / "ck"); }, {"model.safetensors", "named pipe"});
  fs::remove(tmp / "ck/model.safetensors");
  fs::rename(tmp / "model.safetensors", tmp / "ck/model.safetensors");
  expect_fails_fast(fifo, [&] { Checkpoint::open(tmp / "ck", fifo); }, {"pipe.safetensors", "named pipe"});
  fs::remove(tmp / "ck/config.json");
  fs::create_directories(tmp / "ck/config.json");
  expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "is a directory, expected a regular file"});
  fs::remove(tmp / "ck/config.json");
  ASSERT_EQ(::mkfifo((tmp / "ck/config.json").c_str(), 0600), 0);
  expect_fails_fast(tmp / "ck/config.json", [&] { Checkpoint::open(tmp / "ck"); }, {"config.json", "named pipe"});
}

// A path holding a NUL byte would open the file named by its first part: refused, naming the argument and
// showing the whole path.
TEST(SafetensorsStrict, PathsWithEmbeddedNulAreRefused) {
  TempDir tmp;
  write_synthetic_checkpoint(tmp / "ck", test::tiny_spec());
  const std::string nul("\0/elsewhere", 11);
  const std::string ck = tmp / "ck", st = tmp / "ck/model.safetensors", cfg = tmp / "ck/config.json";
  const std::string shown = "\\x00/elsewhere";  // as the message escapes it
  expect_error([&] { Checkpoint::open(ck + nul); }, {"checkpoint directory", "embedded null byte", shown});
  expect_error([&] { Checkpoint::open(ck, cfg + nul); }, {"vlm config", "embedded null byte", shown});
  expect_error([&] { Context::open(st + nul); }, {"context", "embedded null byte", shown});
  expect_error([&] { SafetensorsFile f(st + nul); }, {"embedded null byte", shown});
  expect_error([&] { read_json_file_strict(cfg + nul); }, {"embedded null byte", shown});
  OutputSet outs;
  expect_error([&] { outs.add(tmp / "out.safetensors" + nul, "--out"); }, {"--out", "embedded null byte", shown});
  expect_error([&] { outs.add_input(st + nul, "--context"); }, {"--context", "embedded null byte"});
  expect_error([&] { outs.add_input_dir(ck + nul, "--checkpoint"); }, {"--checkpoint", "embedded null byte"});
  EXPECT_FALSE(fs::exists(tmp / "out.safetensors"));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator{}), 1);  // ck only
}

TEST(SafetensorsStrict, StrictJson) {
  TempDir tmp;
  { std::ofstream(tmp / "dup.json") << R"({"a": {"b": 1, "b": 2}})"; }
  expect_error([&] { read_json_file_strict(tmp / "dup.json"); }, {"dup.json", "duplicate key 'b'"});
  { std::ofstream(tmp / "utf8.json") << "{\"a\": \"\xff\"}"; }
  expect_error([&] { read_json_file_strict(tmp / "utf8.json"); }, {"utf8.json", "invalid JSON"});
  { std::ofstream(tmp / "deep.json") << std::string(10000, '[') << std::string(10000, ']'); }
  expect_error([&] { read_json_file_strict(tmp / "deep.json"); }, {"deep.json", "nested more than 64"});
}

TEST(SafetensorsStrict, UnalignedDataGivesAlignedViews) {
  // U8 [3] first, then I64 and BF16 at odd offsets: valid safetensors, typed reads need alignment.
  std::string h = R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"i":{"dtype":"I64","shape":[2],"data_offsets":[3,19]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[19,21]}})";
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string img = image(h, 0);
  const int64_t iv[2] = {-7, 1ll << 40};
  const uint16_t bv = 0x3f80;
  img += std::string("abc") + std::string(reinterpret_cast<const char*>(iv), 16) + std::string(reinterpret_cast<const char*>(&bv), 2);
  const SafetensorsFile f = SafetensorsFile::from_bytes(img, "u");
  const TensorView i = f.view("i"), b = f.view("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(i.data) % 8, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 2, 0u);
  EXPECT_EQ(static_cast<const int64_t*>(i.data)[0], -7);
  EXPECT_EQ(static_cast<const int64_t*>(i.data)[1], 1ll << 40);
  EXPECT_EQ(to_f32(b)[0], 1.f);
  EXPECT_EQ(f.view("i").data, i.data);  // copied once
}

TEST(SafetensorsStrict, WriterAlignsEveryTensor) {
  TempDir tmp;
  const uint8_t u[3] = {1, 2, 3};
  const int64_t i[1] = {5};
  const float x[3] = {1, 2, 3};
  const uint16_t h[1] = {0};
  write_safetensors(tmp / "a.safetensors", {{"u", {DType::U8, {3}, u, ""}}, {"h", {DType::BF16, {1}, h, ""}},
                                            {"x", {DType::F32, {3}, x, ""}}, {"i", {DType::I64, {1}, i, ""}}});
  const SafetensorsFile f(tmp / "a.safetensors");
  for (const auto& [k, ti] : f.tensors()) EXPECT_EQ(ti.begin % dtype_size(ti.dtype), 0u) << k;
  EXPECT_EQ(to_f32(f.view("x"))[2], 3.f);
  EXPECT_EQ(static_cast<const uint8_t*>(f.view("u").data)[2], 3);
}

TEST(SafetensorsStrict, FileTruncatedWhileMappedIsAnErrorNotASignal) {
  TempDir tmp;
  std::vector<float> w(1 << 18, 2.f);  // 1 MiB
  write_safetensors(tmp / "big.safetensors", {{"w", {DType::F32, {1 << 18}, w.data(), ""}}});
  SafetensorsFile f(tmp / "big.safetensors");
  EXPECT_NO_THROW(f.check_intact());
  EXPECT_NO_THROW(check_mapped_files());
  ASSERT_EQ(::truncate((tmp / "big.safetensors").c_str(), 4096), 0);
  const TensorView v = f.view("w");
  double sum = 0;
  for (int64_t k = 0; k < v.numel(); ++k) sum += static_cast<const float*>(v.data)[k];  // reads past the new end
  EXPECT_LT(sum, 2.0 * v.numel());
  expect_error([&] { f.check_intact(); }, {"big.safetensors", "truncated while in use"});
  expect_error([&] { check_mapped_files(); }, {"big.safetensors", "truncated while in use"});
}

TEST(SafetensorsStrict, FileModifiedWhileMappedIsReported) {
  TempDir tmp;
  std::vector<float> w(64, 2.f);
  write_safetensors(tmp / "m.safetensors", {{"w", {DType::F32, {64}, w.data(), ""}}});
  SafetensorsFile f(tmp / "m.safetensors");
  {  // rewritten in place: same size, new contents and modification time
    const int fd = ::open((tmp / "m.safetensors").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const float z = 0.f;
    ASSERT_EQ(::pwrite(fd, &z, 4, static_cast<off_t>(::lseek(fd, 0, SEEK_END) - 4)), 4);
    const struct timespec later[2] = {{0, UTIME_OMIT}, {2000000000, 0}};
    ASSERT_EQ(::futimens(fd, later), 0);
    ::close(fd);
  }
  expect_error([&] { f.check_intact(); }, {"m.safetensors", "modified while in use", "modification time"});
  {
    std::ofstream(tmp / "m.safetensors", std::ios::app) << "more";
  }
  expect_error([&] { f.check_intact(); }, {"m.safetensors", "modified while in use", "size"});
}

TEST(SafetensorsStrictDeathTest, OtherBusErrorsStillKill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir tmp;
  std::vector<float> w(16, 1.f);
  write_safetensors(tmp / "s.safetensors", {{"w", {DType::F32, {16}, w.data(), ""}}});
  SafetensorsFile f(tmp / "s.safetensors");  // the handler is installed
  // Killed by SIGBUS, or reported by a sanitizer's handler installed before ours: never swallowed.
  EXPECT_DEATH(::raise(SIGBUS), "");
}

TEST(ShardIndex, ShardPathsStayInsideTheCheckpoint) {
  for (const char* ok : {"model-00001-of-00002.safetensors", "sub/model.safetensors", "..model", "a..b/c"})
    EXPECT_EQ(confined_shard_path("/ck", ok, "/ck/i.json", "k"), std::string("/ck/") + ok);
  for (const char* bad : {"../other/model.safetensors", "/etc/passwd", "sub/../../x", "a/./b", "a//b", "", ".", "..", "x/"})
    expect_error([&] { confined_shard_path("/ck", bad, "/ck/i.json", "expert.x"); }, {"/ck/i.json", "weight_map['expert.x']"});
  expect_error([&] { confined_shard_path("/ck", "/abs", "i", "k"); }, {"absolute path"});
  expect_error([&] { confined_shard_path("/ck", std::string("a\0b", 3), "i", "k"); }, {"NUL"});

  TempDir tmp;
  SyntheticCheckpointSpec s = test::tiny_spec();
  s.shards = 2;
  write_synthetic_checkpoint(tmp / "ck", s);
  fs::create_directories(tmp / "other");
  fs::copy_file(tmp / "ck/model-00001-of-00003.safetensors", tmp / "other/model.safetensors");
  const std::string index = tmp / "ck/model.safetensors.index.json";
  const std::string text = [&] { std::ifstream f(index); return std::string(std::istreambuf_iterator<char>(f), {}); }();
  for (const std::string& target : {std::string("../other/model.safetensors"), (tmp / "other/model.safetensors")}) {
    std::string t = text;
    for (size_t p; (p = t.find("model-00001-of-00003.safetensors")) != std::string::npos;) t.replace(p, 32, target);
    { std::ofstream(index) << t; }
    expect_error([&] { Checkpoint::open(tmp / "ck"); }, {"model.safetensors.index.json", target, "inside the checkpoint directory"});
  }
}

}  // namespace
}  // namespace alpamayo
