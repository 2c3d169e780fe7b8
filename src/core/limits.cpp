#include "alpamayo/limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <vector>

#include "alpamayo/environment.h"
#include "alpamayo/error.h"

namespace alpamayo {
namespace {

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  for (int p = 6; p <= 17; ++p) {  // shortest decimal (at least 6 digits) that reads back as v
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

thread_local std::vector<std::string> g_stages;

}  // namespace

void check_range(double v, double lo, double hi, const std::string& what, const std::string& why, ErrorCode code) {
  if (v >= lo && v <= hi) return;
  if (!std::isfinite(v)) throw Error(code, what + " must be finite, found " + num(v));
  throw Error(code, what + " = " + num(v) + " is outside [" + num(lo) + ", " + num(hi) + "]" + why);
}

void MemoryEstimate::add(const std::string& what, double b) {
  if (b <= 0) return;
  bytes += b;
  parts += (parts.empty() ? "" : ", ") + what + " " + format_bytes(b);
}

std::string format_bytes(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) {
    b /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f bytes", b);
  else std::snprintf(buf, sizeof buf, b < 10 ? "%.2f %s" : b < 100 ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

double layer_matrix_params(const ExpertConfig& c) {
  const double D = c.D, q = double(c.Hq) * c.d, kv = double(c.Hkv) * c.d, I = c.I;
  return D * (q + 2 * kv) + q * D + 3 * D * I;
}

double host_bytes_per_weight(const std::string& format) {
  if (format == "int8" || format == "fp8") return 1.0 + 4.0 / 1024;  // one fp32 scale per 1024 values at most
  if (format == "bfp8_b") return 1.0 + 1.0 / 16;  // 8 bits plus one shared exponent byte per 16 values
  if (format == "bfp4_b") return 0.5 + 1.0 / 16;
  if (format == "f32") return 4;
  return 2;  // bf16
}

MemoryEstimate estimate_model_memory(const ExpertConfig& c, const std::string& backend, const std::string& format) {
  const BackendMemory& mem = find_backend(backend).memory;
  MemoryEstimate e;
  const double per = mem.host_bytes_per_weight ? mem.host_bytes_per_weight(format) : 0.0;
  e.add(std::to_string(c.L) + " layers of weights in " + (format.empty() ? "the default format" : format),
        per * c.L * layer_matrix_params(c));
  // action_in_proj / action_out_proj in fp32 on the host (every backend keeps a host copy).
  const double F = double(c.A + 1) * c.n_fourier, h = c.ain_hidden;
  e.add("action projections in f32", 4.0 * (F * h + (c.ain_layers - 1) * h * h + h * c.D + 2.0 * c.D * c.A));
  return e;
}

MemoryEstimate estimate_session_memory(const ExpertConfig& c, const std::string& backend, const KVCache& kv,
                                       const KVCache* unguided, bool capture_layers) {
  const BackendMemory& mem = find_backend(backend).memory;
  MemoryEstimate e;
  const double M = double(kv.B) * c.T, D = c.D, I = c.I, q = double(c.Hq) * c.d, kvw = double(c.Hkv) * c.d;
  const double passes = unguided ? 2 : 1;
  // Activations of one step: the host loop's emb / hidden / velocity, a layer's normed input, q, k, v,
  // attention output, residual, gate and up, over M = B * T rows (fp32).
  e.add("activations over B*T = " + std::to_string(int64_t(M)) + " rows",
        4.0 * M * (passes * (3 * D + q + 2 * kvw + q + D + 2 * I)));
  e.add("rope tables", passes * 4.0 * 2 * M * c.d);
  if (capture_layers) e.add("per-layer captures", 4.0 * M * D * (c.L + 2));
  if (mem.session) mem.session(e, c, kv, unguided);
  return e;
}

double available_memory_bytes(std::string* source) {
  double avail = -1;
  std::string src;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    double kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        src = "MemAvailable in /proc/meminfo";
        break;
      }
    }
  }
  if (avail < 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      avail = double(pages) * page;
      src = "free physical memory (sysconf)";
    }
  }
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    // The address space already in use does not count against what is left: approximate it by VmSize.
    std::ifstream f("/proc/self/status");
    std::string line;
    double used = 0;
    while (std::getline(f, line))
      if (line.rfind("VmSize:", 0) == 0) used = std::atof(line.c_str() + 7) * 1024;
    const double left = double(rl.rlim_cur) - used;
    if (avail < 0 || left < avail) {
      avail = std::max(0.0, left);
      src = "the address-space limit (ulimit -v)";
    }
  }
  if (const std::string limit = memory_limit_from_environment(); !limit.empty()) {
    const char* env = limit.c_str();
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(env, &end);
    std::string suffix = end ? end : "";
    double mul = suffix.empty() ? 1 : suffix == "K" || suffix == "k" ? 1024.0 : suffix == "M" || suffix == "m" ? 1048576.0
                                    : suffix == "G" || suffix == "g" ? 1073741824.0 : -1;
    check(end != env && errno == 0 && mul > 0 && std::isfinite(v) && v >= 0,
          std::string("ALPAMAYO_MEMORY_LIMIT = '") + env + "': expected a number of bytes, optionally with K, M or G");
    v *= mul;
    if (avail < 0 || v < avail) {
      avail = v;
      src = "ALPAMAYO_MEMORY_LIMIT";
    }
  }
  if (source) *source = src;
  return avail;
}

void check_memory(const MemoryEstimate& e, const std::string& stage) {
  std::string src;
  const double avail = available_memory_bytes(&src);
  if (avail < 0) return;
  check(e.bytes <= avail, ErrorCode::OutOfMemory,
        stage + " needs about " + format_bytes(e.bytes) + " (" + e.parts + ") but only " + format_bytes(avail) +
            " is available (" + src + ")");
}

// The innermost stage an exception unwound through, kept for the API boundary that catches it (the stack
// of stages is empty by then). Reset when the next outermost stage starts.
thread_local std::string g_unwound;
thread_local std::vector<int> g_uncaught;

StageScope::StageScope(std::string what) {
  if (g_stages.empty()) g_unwound.clear();
  g_stages.push_back(std::move(what));
  g_uncaught.push_back(std::uncaught_exceptions());
}
StageScope::~StageScope() {
  if (std::uncaught_exceptions() > g_uncaught.back() && g_unwound.empty()) {
    try {
      g_unwound = g_stages.back();
    } catch (...) {
    }
  }
  g_stages.pop_back();
  g_uncaught.pop_back();
}

std::string current_stage() { return g_stages.empty() ? g_unwound : g_stages.back(); }

std::string out_of_memory_message() {
  std::string src;
  const double avail = available_memory_bytes(&src);
  const std::string stage = current_stage();
  std::string m = "out of memory";
  m += stage.empty() ? std::string() : " while " + stage;
  if (avail >= 0) m += " (" + format_bytes(avail) + " available now, " + src + ")";
  return m;
}

}  // namespace alpamayo
