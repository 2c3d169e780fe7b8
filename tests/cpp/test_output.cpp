// OutputSet (output.h): exclusive unpredictable temporaries, refusals, all-or-nothing commit, cleanup.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "alpamayo/output.h"
#include "io/inputs.h"
#include "test_util.h"

namespace alpamayo {
namespace {
using test::expect_error;
using test::TempDir;
namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::set<std::string> names(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

TEST(Output, WritesAllOutputsOnCommitAndNothingBefore) {
  TempDir tmp;
  put(tmp / "b.json", "old");
  OutputSet outs;
  const size_t a = outs.add(tmp / "a.bin", "--out");
  const size_t b = outs.add(tmp / "b.json", "--json");
  // Reserved at once: one hidden, unpredictable temporary per output, next to its target.
  std::set<std::string> n = names(tmp.path());
  ASSERT_EQ(n.size(), 3u);
  for (const auto& s : n) {
    if (s == "b.json") continue;
    EXPECT_EQ(s[0], '.');
    EXPECT_TRUE(s.rfind(".a.bin.", 0) == 0 || s.rfind(".b.json.", 0) == 0) << s;
    EXPECT_EQ(s.size() - s.find('.', 3) - 1, 12u + 4u) << s;  // 12 random characters + ".tmp"
  }
  outs.write(a, "AAA");
  outs.write(b, "new");
  EXPECT_FALSE(fs::exists(tmp / "a.bin"));
  EXPECT_EQ(slurp(tmp / "b.json"), "old");
  outs.commit();
  EXPECT_EQ(slurp(tmp / "a.bin"), "AAA");
  EXPECT_EQ(slurp(tmp / "b.json"), "new");
  EXPECT_EQ(names(tmp.path()), (std::set<std::string>{"a.bin", "b.json"}));
}

TEST(Output, DirectoriesCreatedForASetGoUnlessCommitted) {
  TempDir tmp;
  const fs::path dir = fs::path(tmp / "a") / "b";
  {
    OutputSet outs;
    outs.create_dir(dir.string(), "--out");
    ASSERT_TRUE(fs::is_directory(dir));
    outs.write(outs.add((dir / "x.bin").string(), "--out"), "X");
  }  // destroyed uncommitted: the file, then both directories go
  EXPECT_TRUE(fs::is_empty(tmp.path()));
  {
    OutputSet outs;
    outs.create_dir(dir.string(), "--out");
    outs.write(outs.add((dir / "x.bin").string(), "--out"), "X");
    outs.discard();
  }
  EXPECT_TRUE(fs::is_empty(tmp.path()));
  {
    OutputSet outs;
    outs.create_dir(dir.string(), "--out");
    outs.write(outs.add((dir / "x.bin").string(), "--out"), "X");
    outs.commit();
  }
  EXPECT_EQ(slurp(dir / "x.bin"), "X");
  {  // an existing directory is used and never removed, even uncommitted
    OutputSet outs;
    outs.create_dir(dir.string(), "--out");
    outs.write(outs.add((dir / "y.bin").string(), "--out"), "Y");
  }
  EXPECT_EQ(names(dir), (std::set<std::string>{"x.bin"}));
  put(tmp / "file", "f");
  OutputSet outs;
  expect_error([&] { outs.create_dir(tmp / "file", "--out"); }, {"--out", "is a regular file", "expected a directory"});
}

// A library user's process may run with 0, 1 or 2 closed: files the library opens must never take them
// (what the process prints there would land in an output), and the library must not open them either.
TEST(Output, NeverUsesClosedStandardDescriptors) {
  TempDir tmp;
  put(tmp / "in.bin", "input");
  int saved[3];
  for (int fd = 0; fd < 3; ++fd) saved[fd] = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  for (int fd = 0; fd < 3; ++fd) ::close(fd);
  int out_fd_open[3], in_fd = -1;
  std::string error;
  try {
    struct stat st {};
    in_fd = open_regular_file(tmp / "in.bin", &st);
    OutputSet outs;
    const size_t a = outs.add(tmp / "a.bin", "--out");
    const size_t b = outs.add(tmp / "b.bin", "--json");
    outs.write(a, "AAA");
    outs.write(b, "BBB");
    for (int fd = 0; fd < 3; ++fd) out_fd_open[fd] = ::fcntl(fd, F_GETFD);
    outs.commit();
  } catch (const std::exception& e) {
    error = e.what();
  }
  int after[3];
  for (int fd = 0; fd < 3; ++fd) after[fd] = ::fcntl(fd, F_GETFD);
  if (in_fd >= 0) ::close(in_fd);
  for (int fd = 0; fd < 3; ++fd) {
    ::dup2(saved[fd], fd);
    ::close(saved[fd]);
  }
  ASSERT_EQ(error, "");
  EXPECT_GE(in_fd, 3);
  for (int fd = 0; fd < 3; ++fd) {
    EXPECT_EQ(out_fd_open[fd], -1) << "descriptor " << fd << " was taken while the outputs were open";
    EXPECT_EQ(after[fd], -1) << "descriptor " << fd << " was opened by the library";
  }
  EXPECT_EQ(slurp(tmp / "a.bin"), "AAA");
  EXPECT_EQ(slurp(tmp / "b.bin"), "BBB");
}

TEST(Output, FdAboveStandard) {
  EXPECT_EQ(fd_above_standard(-1), -1);
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 3);  // the test runner has its standard descriptors
  EXPECT_EQ(fd_above_standard(fd), fd);
  ::close(fd);
  const int saved = ::fcntl(0, F_DUPFD_CLOEXEC, 10);
  ::close(0);
  const int low = ::open("/dev/null", O_RDONLY);
  const int moved = fd_above_standard(low);
  const int zero_after = ::fcntl(0, F_GETFD);
  const int flags = ::fcntl(moved, F_GETFD);
  ::dup2(saved, 0);
  ::close(saved);
  EXPECT_EQ(low, 0);
  EXPECT_GE(moved, 3);
  EXPECT_EQ(zero_after, -1);
  EXPECT_TRUE(flags & FD_CLOEXEC);
  ::close(moved);
}

TEST(Output, TemporaryNamesAreUnpredictable) {
  TempDir tmp;
  std::set<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    OutputSet outs;
    outs.add(tmp / "x", "--out");
    for (const auto& s : names(tmp.path())) EXPECT_TRUE(seen.insert(s).second) << "temporary name reused: " << s;
  }
  EXPECT_TRUE(fs::is_empty(tmp.path()));  // destroyed uncommitted: nothing left
}

TEST(Output, NeverFollowsPlantedLinks) {
  TempDir tmp;
  put(tmp / "victim", "precious");
  // Links at the old predictable temporary names and at the output itself.
  for (int pid = getpid() - 5; pid < getpid() + 5; ++pid)
    fs::create_symlink(tmp / "victim", tmp / ("out.safetensors.tmp." + std::to_string(pid)));
  write_text_file(tmp / "out.safetensors", "result");
  EXPECT_EQ(slurp(tmp / "out.safetensors"), "result");
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
  fs::create_symlink(tmp / "victim", tmp / "link.json");
  OutputSet outs;
  expect_error([&] { outs.add(tmp / "link.json", "--json"); }, {"--json", "link.json", "symbolic link"});
  EXPECT_TRUE(fs::is_symlink(tmp / "link.json"));
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
}

// A character device to write to: as root a private copy of /dev/null (a broken build must never be able
// to replace the real one), otherwise /dev/null itself, which only root could replace.
std::string null_device(const TempDir& tmp) {
  if (::geteuid() != 0) return "/dev/null";
  const std::string dev = tmp / "null";
  return ::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0 ? dev : "";  // "": no CAP_MKNOD, skip
}

TEST(Output, RefusesNonRegularTargets) {
  TempDir tmp;
  OutputSet outs;
  const std::string dev = null_device(tmp);
  if (!dev.empty())
    expect_error([&] { outs.add(dev, "--out"); }, {"--out " + dev, "character device", "regular files"});
  ASSERT_EQ(::mkfifo((tmp / "fifo").c_str(), 0600), 0);
  expect_error([&] { outs.add(tmp / "fifo", "--svg"); }, {"--svg", "named pipe"});
  fs::create_directories(tmp / "dir");
  expect_error([&] { outs.add(tmp / "dir", "--out"); }, {"dir", "is a directory"});
  expect_error([&] { outs.add(tmp / "dir/", "--out"); }, {"names a directory"});
  expect_error([&] { outs.add("", "--out"); }, {"--out", "empty output path"});
  expect_error([&] { outs.add(tmp / "nope/x.json", "--json"); }, {"--json", "nope", "does not exist"});
  put(tmp / "file", "x");
  expect_error([&] { outs.add(tmp / "file/x.json", "--json"); }, {"--json", "not a directory"});
  EXPECT_EQ(outs.size(), 0u);
  struct stat st {};
  EXPECT_TRUE(dev.empty() || (::stat(dev.c_str(), &st) == 0 && S_ISCHR(st.st_mode)));
}

TEST(Output, RefusesUnwritableDirectoryBeforeAnyWork) {
  TempDir tmp;
  std::string dir = tmp / "ro";
  if (::geteuid() == 0) {
    dir = "/sys";  // not writable, even for root
  } else {
    fs::create_directories(dir);
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  }
  OutputSet outs;
  expect_error([&] { outs.add(dir + "/x.json", "--json"); }, {"--json", "cannot create a file in directory"});
}

TEST(Output, RefusesInputsAndDuplicates) {
  TempDir tmp;
  put(tmp / "ctx.safetensors", "input");
  fs::create_directories(tmp / "ck");
  put(tmp / "ck/config.json", "{}");
  put(tmp / "ck/model.safetensors", "weights");
  fs::create_hard_link(tmp / "ctx.safetensors", tmp / "hard");
  fs::create_directories(tmp / "sub");
  {
    OutputSet outs;
    outs.add_input(tmp / "ctx.safetensors", "--context");
    outs.add_input(tmp / "ck", "--checkpoint");
    outs.add_input(tmp / "absent", "--noise");  // missing inputs are the reader's business
    expect_error([&] { outs.add(tmp / "ctx.safetensors", "--out"); }, {"--out", "same file as --context", "input"});
    expect_error([&] { outs.add(tmp.path().string() + "/sub/../ctx.safetensors", "--out"); }, {"same file as --context"});
    expect_error([&] { outs.add(tmp / "hard", "--out"); }, {"same file as --context"});
    expect_error([&] { outs.add(tmp / "ck/model.safetensors", "--out"); }, {"same file as --checkpoint", "model.safetensors"});
    expect_error([&] { outs.add(tmp / "ck/config.json", "--json"); }, {"same file as --checkpoint"});
    outs.add(tmp / "out.json", "--json");
    expect_error([&] { outs.add(tmp / "out.json", "--out"); }, {"--out", "same file as --json"});
    expect_error([&] { outs.add(tmp.path().string() + "/sub/../out.json", "--svg"); }, {"--svg", "same file as --json"});
    outs.add(tmp / "ck/new.json", "--layers-out");  // a new file next to the checkpoint is fine
  }
  {  // inputs declared after the outputs are checked too
    OutputSet outs;
    outs.add(tmp / "ctx.safetensors", "--out");
    expect_error([&] { outs.add_input(tmp / "ctx.safetensors", "--context"); }, {"same file as --context"});
  }
  EXPECT_EQ(slurp(tmp / "ctx.safetensors"), "input");
  EXPECT_EQ(names(tmp.path()), (std::set<std::string>{"ck", "ctx.safetensors", "hard", "sub"}));
  EXPECT_EQ(names(tmp / "ck"), (std::set<std::string>{"config.json", "model.safetensors"}));
}

TEST(Output, FailedCommitRestoresEveryEarlierTarget) {
  TempDir tmp;
  put(tmp / "a", "old a");
  OutputSet outs;
  const size_t a = outs.add(tmp / "a", "--out");
  const size_t b = outs.add(tmp / "b", "--json");
  outs.write(a, "new a");
  outs.write(b, "new b");
  fs::create_directories(tmp / "b");  // the second target becomes a directory during the run
  expect_error([&] { outs.commit(); }, {"--json", "became a directory", "no output was written"});
  EXPECT_EQ(slurp(tmp / "a"), "old a");
  EXPECT_EQ(names(tmp.path()), (std::set<std::string>{"a", "b"}));
  EXPECT_TRUE(fs::is_empty(tmp / "b"));
}

TEST(Output, FailedWriteOrDiscardLeavesNothing) {
  TempDir tmp;
  put(tmp / "keep", "old");
  expect_error([&] {
    write_file_atomically(tmp / "keep", [](const ByteSink& out) {
      out("partial", 7);
      throw Error("producer failed");
    });
  }, {"producer failed"});
  EXPECT_EQ(slurp(tmp / "keep"), "old");
  {
    OutputSet outs;
    outs.write(outs.add(tmp / "x"), "data");
    outs.discard();
    EXPECT_EQ(outs.size(), 0u);
  }
  EXPECT_EQ(names(tmp.path()), (std::set<std::string>{"keep"}));
}

TEST(Output, NothingIsCommittedWhenAMappedInputChanged) {
  TempDir tmp;
  std::vector<float> w(1024, 1.f);
  write_safetensors(tmp / "in.safetensors", {{"w", {DType::F32, {1024}, w.data(), ""}}});
  SafetensorsFile in(tmp / "in.safetensors");
  OutputSet outs;
  outs.write(outs.add(tmp / "out.json"), "result");
  ASSERT_EQ(::truncate((tmp / "in.safetensors").c_str(), 100), 0);
  expect_error([&] { outs.commit(); }, {"in.safetensors", "while in use"});
  EXPECT_FALSE(fs::exists(tmp / "out.json"));
  EXPECT_EQ(names(tmp.path()), (std::set<std::string>{"in.safetensors"}));
}

TEST(OutputDeathTest, TerminationSignalsRemoveTemporaries) {
  GTEST_FLAG_SET(death_test_style, "fast");  // the child must see this TempDir
  TempDir tmp;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    // A signal ignored when the process started (nohup, a background job of a script) stays ignored, as
    // shells do, so no handler is installed for it and it cannot end the run: nothing to test then.
    struct sigaction cur {};
    if (::sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler == SIG_IGN) {
      std::printf("[ SKIPPED  ] signal %d is ignored by this process (inherited)\n", sig);
      continue;
    }
    EXPECT_EXIT(
        {
          OutputSet outs;
          outs.write(outs.add(tmp / "a.safetensors", "--out"), "partial");
          outs.add(tmp / "b.json", "--json");
          ::kill(::getpid(), sig);
          ::pause();
        },
        testing::KilledBySignal(sig), "");
    EXPECT_TRUE(fs::is_empty(tmp.path())) << "signal " << sig;
  }
}

}  // namespace
}  // namespace alpamayo
