// alpamayo-expert: sample driving trajectories with the Alpamayo action expert.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>

#include "alpamayo/error.h"
#include "alpamayo/limits.h"
#include "commands.h"

namespace {

// A descriptor 0, 1 or 2 closed at start would be taken by the next file opened (a temporary output, an
// input), and messages written to stdout or stderr would go into it: each closed one is opened on /dev/null
// before anything else runs. Returns false when that fails.
bool open_standard_descriptors() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int n = ::open("/dev/null", O_RDWR);  // the lowest free descriptor: fd itself
    if (n != fd) {
      if (n >= 0) ::close(n);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!open_standard_descriptors()) return 1;
  CLI::App app{"alpamayo-expert: the Alpamayo action expert (flow-matching trajectory head) in C++"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, alpamayo::cli::Run>> cmds;
  auto reg = [&](const char* name, const char* help, alpamayo::cli::Run (*add)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    cmds.emplace_back(sub, add(*sub));
  };
  reg("sample", "sample trajectories from a checkpoint and a VLM context", alpamayo::cli::add_sample);
  reg("inspect", "show what a checkpoint holds and what the engine will use", alpamayo::cli::add_inspect);
  reg("make-checkpoint", "write a synthetic, seeded checkpoint in a release layout", alpamayo::cli::add_make_checkpoint);
  reg("make-context", "write a synthetic, seeded VLM context for a checkpoint", alpamayo::cli::add_make_context);
  reg("backends", "list the backends in this build, their weight formats and, after '; kv', their KV cache formats "
                  "(the first of each is the default), after '; features' the context features they run, and after '; runs' "
                  "the weight formats this machine runs where it cannot run them all (fp8 on a GPU older than sm_89)",
      alpamayo::cli::add_backends);
  reg("demo", "synthetic full-size model + ~4,700-row context -> trajectories, timing, JSON and SVG",
      alpamayo::cli::add_demo);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : cmds)
      if (sub->parsed()) run();
  } catch (const alpamayo::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: " << alpamayo::out_of_memory_message() << "\n";
    return 1;
  } catch (const std::length_error& e) {
    std::cerr << "error: allocation too large (" << e.what() << ")"
              << (alpamayo::current_stage().empty() ? "" : " while " + alpamayo::current_stage()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
