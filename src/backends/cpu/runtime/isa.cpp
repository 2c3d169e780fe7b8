#include "backends/cpu/runtime/isa.h"

#include <cpuid.h>
#include <time.h>
#include <dnnl.hpp>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "alpamayo/error.h"

namespace alpamayo::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
bool request_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

uint32_t detect() {
  uint32_t f = 0;
  const Regs l1 = cpuid(1, 0);
  if (!bit(l1.c, 27)) return 0;  // no OSXSAVE: the OS saves no AVX state
  const uint64_t xcr0 = xgetbv0();
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
  const Regs l7 = cpuid(7, 0), l71 = cpuid(7, 1);
  if (ymm && bit(l7.b, 5) && bit(l1.c, 12) && bit(l1.c, 29) && bit(l1.c, 28)) f |= kAvx2Fma;
  if ((f & kAvx2Fma) && zmm && bit(l7.b, 16) && bit(l7.b, 17) && bit(l7.b, 30) && bit(l7.b, 31)) f |= kAvx512;
  if ((f & kAvx512) && bit(l7.c, 11)) f |= kAvx512Vnni;
  if ((f & kAvx512) && bit(l71.a, 5)) f |= kAvx512Bf16;
  if ((f & kAvx2Fma) && bit(l71.a, 4)) f |= kAvxVnni;
  if ((f & kAvx512) && bit(l7.d, 24) && (bit(l7.d, 22) || bit(l7.d, 25)) && request_amx() &&
      (xgetbv0() & 0x60000) == 0x60000) {
    if (bit(l7.d, 22)) f |= kAmxBf16;
    if (bit(l7.d, 25)) f |= kAmxInt8;
  }
  return f;
}

struct CapName {
  const char* name;
  uint32_t bits;
  dnnl::cpu_isa onednn;
};
constexpr uint32_t kAll = kAvx2Fma | kAvx512 | kAvx512Vnni | kAvx512Bf16 | kAvxVnni | kAmxBf16 | kAmxInt8;
const CapName kCaps[] = {
    {"avx2", kAvx2Fma, dnnl::cpu_isa::avx2},
    {"avx2_vnni", kAvx2Fma | kAvxVnni, dnnl::cpu_isa::avx2_vnni},
    {"avx512", kAvx2Fma | kAvx512, dnnl::cpu_isa::avx512_core},
    {"avx512_vnni", kAvx2Fma | kAvx512 | kAvx512Vnni, dnnl::cpu_isa::avx512_core_vnni},
    {"avx512_bf16", kAvx2Fma | kAvx512 | kAvx512Vnni | kAvx512Bf16 | kAvxVnni, dnnl::cpu_isa::avx512_core_bf16},
    {"amx", kAll, dnnl::cpu_isa::all},
    {"all", kAll, dnnl::cpu_isa::all},
};

const CapName& cap_entry(const std::string& name, const std::string& source) {
  for (const CapName& c : kCaps)
    if (name == c.name) return c;
  std::string ok;
  for (const CapName& c : kCaps) ok += std::string(ok.empty() ? "" : ", ") + c.name;
  throw Error(source + "=\"" + name + "\" is not an instruction-set cap; use one of: " + ok);
}

uint32_t detected_once() {
  static const uint32_t bits = detect();
  return bits;
}

// The process's ceiling (set_isa_ceiling), guarded by its mutex until the first isa() fixes it. Constructed on
// first use: a program may set it from a static initialiser of its own, before this file's statics would be.
struct Ceiling {
  std::mutex mu;
  bool read = false;
  uint32_t bits = ~0u;
  std::string cap, source = "ALPAMAYO_CPU_ISA";
  // oneDNN's instruction set is one per process (dnnl::set_max_cpu_isa, only before its first primitive): the
  // ceiling's, set once by set_isa_ceiling; all it detects otherwise.
  uint32_t onednn_bits = kAll;
};
Ceiling& ceiling() {
  static Ceiling c;
  return c;
}

}  // namespace

std::string isa_names(uint32_t bits) {
  static const std::pair<uint32_t, const char*> names[] = {
      {kAvx2Fma, "avx2_fma"}, {kAvx512, "avx512"},     {kAvx512Vnni, "avx512_vnni"}, {kAvx512Bf16, "avx512_bf16"},
      {kAvxVnni, "avx_vnni"}, {kAmxBf16, "amx_bf16"}, {kAmxInt8, "amx_int8"}};
  std::string s;
  for (const auto& [b, n] : names)
    if (bits & b) s += std::string(s.empty() ? "" : " ") + n;
  return s.empty() ? "none" : s;
}

uint32_t isa_cap_from_name(const std::string& name) { return cap_entry(name, "ALPAMAYO_CPU_ISA").bits; }

std::string IsaInfo::describe() const {
  std::string s = isa_names(usable);
  if (const uint32_t off = detected & ~usable) s += " [off by " + cap_source + "=" + cap + ": " + isa_names(off) + "]";
  return s;
}

void set_isa_ceiling(const std::string& cap, const std::string& source) {
  if (cap.empty()) return;
  Ceiling& g = ceiling();
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.read) throw Error(source + "=" + cap + ": the instruction-set ceiling is set after the backend started");
  const CapName& c = cap_entry(cap, source);
  if (dnnl::set_max_cpu_isa(c.onednn) != dnnl::status::success)
    throw Error(source + "=" + cap + ": oneDNN's instruction set was already fixed in this process");
  g.onednn_bits = c.bits;
  g.bits = c.bits;
  g.cap = cap;
  g.source = source;
}

const IsaInfo& isa() {
  static const IsaInfo info = [] {
    Ceiling& g = ceiling();
    std::lock_guard<std::mutex> lk(g.mu);
    g.read = true;
    IsaInfo i;
    i.detected = detected_once();
    i.usable = i.detected & g.bits;
    i.cap = g.cap;
    i.cap_source = g.source;
    return i;
  }();
  return info;
}

IsaInfo isa_with_cap(const std::string& cap, const std::string& source) {
  IsaInfo i = isa();
  if (cap.empty()) return i;
  const CapName& c = cap_entry(cap, source);
  i.usable &= c.bits;
  i.cap = cap;
  i.cap_source = source;
  return i;
}

KernelScope process_kernel_scope() { return {isa(), "", "kernels"}; }

std::string onednn_within_cap(const IsaInfo& i) {
  isa();  // the ceiling, and with it oneDNN's instruction set, is fixed from here on
  if ((ceiling().onednn_bits & i.detected & ~i.usable) == 0) return "";
  return "oneDNN's instruction set is one per process (" +
         (isa().cap.empty() ? std::string("all this CPU has") : isa().cap_source + "=" + isa().cap) +
         ") and the model's cap " + i.cap_source + "=" + i.cap + " takes " +
         isa_names(ceiling().onednn_bits & i.detected & ~i.usable) + " from it";
}

std::string forced_kernel(const std::string& op, const std::string& spec, const std::string& src) {
  bool known = false;
  for (const char* o : kKernelOps) known = known || op == o;
  const std::string ops = [] {
    std::string s;
    for (const char* o : kKernelOps) s += std::string(s.empty() ? "" : ", ") + o;
    return s;
  }();
  if (!known) throw Error(ErrorCode::Unsupported, "cpu backend: no kernel choice for op \"" + op + "\" (ops: " + ops + ")");
  if (spec.empty()) return "";
  std::string found, seen = ",";  // the ops named so far, comma-delimited
  const std::string& v = spec;
  size_t pos = 0;
  while (pos <= v.size()) {
    const size_t end = std::min(v.find(',', pos), v.size());
    const std::string item = v.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw Error(src + "=\"" + v + "\": \"" + item + "\" is not op=kernel (ops: " + ops + ")");
    const std::string o = item.substr(0, eq);
    bool ok = false;
    for (const char* k : kKernelOps) ok = ok || o == k;
    if (!ok) throw Error(ErrorCode::Unsupported, src + "=\"" + v + "\": unknown op \"" + o + "\" (ops: " + ops + ")");
    if (seen.find("," + o + ",") != std::string::npos)
      throw Error(src + "=\"" + v + "\": op \"" + o + "\" given twice");
    seen += o + ",";
    if (o == op) found = item.substr(eq + 1);
    pos = end + 1;
  }
  return found;
}

void record_kernel_choice(KernelChoices& made, const KernelChoice& c) {
  for (KernelChoice& e : made)
    if (e.op == c.op) {
      e = c;
      return;
    }
  made.push_back(c);
}

std::string format_kernel_choice(const KernelChoice& c) {
  char rate[32];
  if (c.gflops > 0) std::snprintf(rate, sizeof rate, "%7.1f %-7s", c.gflops, c.unit.c_str());
  else std::snprintf(rate, sizeof rate, "%15s", "not timed");
  char line[160];
  std::snprintf(line, sizeof line, "%-17s %-12s %s  ", c.op.c_str(), c.kernel.c_str(), rate);
  return line + (c.instruction.empty() ? std::string("-") : c.instruction) + "; " + c.why;
}

std::string format_kernel_check(const KernelChoice& c) {
  if (c.check.empty()) return "";
  char op[32];
  std::snprintf(op, sizeof op, "%-17s ", c.op.c_str());
  return op + c.check;
}

std::string kernel_pin(const KernelChoices& made) {
  std::string pin;
  for (const char* op : kKernelOps)
    for (const KernelChoice& c : made)
      if (c.op == op) pin += (pin.empty() ? "" : ",") + c.op + "=" + c.kernel;
  return pin;
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

}  // namespace alpamayo::cpu
