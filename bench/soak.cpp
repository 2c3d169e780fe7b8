// Soak: one process, one model, N sessions in N threads, thousands of samples over random contexts and sizes
// (contexts opened, bound and dropped again and again: the mapped-file and descriptor paths), with resident memory,
// open descriptors and mapped files read every `--every` samples. What must hold: descriptors and mapped files the
// same from the first checkpoint to the last, resident memory flat (printed; --max-rss-growth makes it a check).
// Built with ASan, LeakSanitizer checks at exit that nothing leaked (scripts/test.sh runs it so at small sizes).
//
//   build/bench/soak --threads 8 --samples 4000            # docs/PERFORMANCE.md, "Soak"
#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "alpamayo/synthetic.h"

namespace {

struct Reading {
  long samples = 0;
  double rss_mb = 0;
  int fds = 0, mapped_files = 0;
};

double rss_mb() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return double(resident) * double(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n - 1;  // the directory's own descriptor
}

// Distinct files mapped (the checkpoint's shards and any context still mapped), from /proc/self/maps.
int mapped_files(const std::string& under) {
  std::ifstream f("/proc/self/maps");
  std::vector<std::string> seen;
  for (std::string line; std::getline(f, line);) {
    const size_t p = line.find(under);
    if (p == std::string::npos) continue;
    const std::string path = line.substr(p);
    bool dup = false;
    for (const std::string& s : seen) dup |= s == path;
    if (!dup) seen.push_back(path);
  }
  return int(seen.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Soak: many sessions of one model in threads over random contexts; memory, descriptors, mappings"};
  int threads = 8, samples = 4000, every = 100, contexts = 12, layers = 2, hidden = 128, max_rows = 600;
  std::string backend = "cpu", dir = "";
  double max_rss_growth = 0;
  app.add_option("--threads", threads, "sessions, one per thread");
  app.add_option("--samples", samples, "samples in all");
  app.add_option("--every", every, "samples between readings");
  app.add_option("--contexts", contexts, "context files of random sizes to draw from");
  app.add_option("--layers", layers, "model layers");
  app.add_option("--hidden", hidden, "hidden size (heads 4/2, head dim 32, MLP 3x)");
  app.add_option("--max-rows", max_rows, "largest prompt rows of a context");
  app.add_option("--backend", backend, "backend");
  app.add_option("--dir", dir, "scratch directory (default: a new one under /tmp, removed at the end)");
  app.add_option("--max-rss-growth", max_rss_growth,
                 "fail if resident memory grows by more than this many MB from the first reading to the last (0: print only)");
  CLI11_PARSE(app, argc, argv);
  namespace fs = std::filesystem;
  const bool own_dir = dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/alpamayo-soak-XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  int rc = 0;
  try {
    alpamayo::SyntheticCheckpointSpec ck;
    ck.L = layers, ck.D = hidden, ck.Hq = 4, ck.Hkv = 2, ck.d = 32, ck.I = 3 * hidden, ck.ain_hidden = 32;
    ck.T = 16, ck.steps = 3, ck.shards = 2;
    write_synthetic_checkpoint(dir + "/ck", ck);
    auto ckpt = alpamayo::Checkpoint::open(dir + "/ck");
    alpamayo::BackendOptions opts;
    opts.threads = 1;  // one thread per session: the sessions are the parallelism
    alpamayo::options_from_environment(opts, backend);
    auto model = alpamayo::Model::load(ckpt, backend, opts);
    // Contexts of random batch sizes, rows, valid lengths, shared prompts with suffixes.
    std::mt19937 rng(1);
    std::vector<std::string> paths;
    for (int c = 0; c < contexts; ++c) {
      alpamayo::SyntheticContextSpec cs;
      cs.B = 1 + int(rng() % 6);
      cs.P = 8 + int(rng() % std::max(1, max_rows - 8));
      if (c % 3 == 2) {  // shared prompt with per-sample suffixes
        cs.G = 1;
        cs.Q = 1 + int(rng() % 24);
      }
      const int G = cs.G ? cs.G : cs.B;
      for (int g = 0; g < G; ++g) cs.valid_len.push_back(1 + int64_t(rng() % cs.P));
      for (int b = 0; b < cs.B; ++b) cs.rope_delta.push_back(int64_t(rng() % 200) - 100);
      cs.seed = c;
      paths.push_back(dir + "/ctx" + std::to_string(c) + ".safetensors");
      write_synthetic_context(paths.back(), model->config(), cs);
    }
    std::atomic<long> done{0};
    std::mutex mu;
    std::vector<Reading> readings;
    std::atomic<bool> failed{false};
    auto read_now = [&](long n) {
      std::lock_guard<std::mutex> lk(mu);
      readings.push_back({n, rss_mb(), open_fds(), mapped_files(dir)});
    };
    const Reading before{0, rss_mb(), open_fds(), mapped_files(dir)};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        std::mt19937 r(100 + t);
        alpamayo::Session s(model);
        try {
          for (;;) {
            const long n = done.fetch_add(1);
            if (n >= samples) break;
            s.bind(alpamayo::Context::open(paths[r() % paths.size()]));  // the previous context is dropped here
            s.sample({.steps = 1 + int(r() % 3), .seed = uint64_t(n), .all_steps = (n % 2) == 0});
            if ((n + 1) % every == 0) read_now(n + 1);
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "soak: thread %d: %s\n", t, e.what());
          failed = true;
        }
      });
    for (std::thread& th : pool) th.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (failed) return 1;
    std::sort(readings.begin(), readings.end(), [](const Reading& a, const Reading& b) { return a.samples < b.samples; });
    std::printf("soak: %d sessions in %d threads, %d samples over %d contexts (B 1-6, up to %d rows), %s backend, "
                "%.1f s (%.0f samples/s)\n", threads, threads, samples, contexts, max_rows, backend.c_str(), secs,
                samples / secs);
    std::printf("%10s %10s %6s %12s\n", "samples", "RSS MB", "fds", "mapped files");
    for (size_t i = 0; i < readings.size(); ++i)
      if (i < 3 || i + 3 >= readings.size() || i % std::max<size_t>(1, readings.size() / 10) == 0)
        std::printf("%10ld %10.1f %6d %12d\n", readings[i].samples, readings[i].rss_mb, readings[i].fds,
                    readings[i].mapped_files);
    if (readings.size() >= 2) {
      // The first reading can come before every thread has bound a context once: compare from the second.
      const Reading& a = readings[std::min<size_t>(1, readings.size() - 1)];
      const Reading& b = readings.back();
      std::printf("from %ld to %ld samples: RSS %+.1f MB, fds %+d, mapped files %+d\n", a.samples, b.samples,
                  b.rss_mb - a.rss_mb, b.fds - a.fds, b.mapped_files - a.mapped_files);
    }
    // Every session is gone with its thread: exactly the descriptors and mappings of before the first sample.
    const Reading after{samples, rss_mb(), open_fds(), mapped_files(dir)};
    std::printf("before the first sample: fds %d, mapped files %d; after the last session: fds %d, mapped files %d\n",
                before.fds, before.mapped_files, after.fds, after.mapped_files);
    if (after.fds != before.fds || after.mapped_files != before.mapped_files) {
      std::fprintf(stderr, "soak: descriptors or mapped files left behind\n");
      rc = 1;
    }
    if (readings.size() >= 2) {
      const Reading& a = readings[std::min<size_t>(1, readings.size() - 1)];
      const Reading& b = readings.back();
      if (max_rss_growth > 0 && b.rss_mb - a.rss_mb > max_rss_growth) {
        std::fprintf(stderr, "soak: resident memory grew by %.1f MB (limit %.1f)\n", b.rss_mb - a.rss_mb,
                     max_rss_growth);
        rc = 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak: %s\n", e.what());
    rc = 1;
  }
  if (own_dir) std::filesystem::remove_all(dir);
  return rc;
}
