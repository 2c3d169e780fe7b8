#include "backends/cpu/kernel_registry.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "alpamayo/error.h"

namespace alpamayo::cpu {
namespace {

const KernelCandidate* find(const KernelOp& op, const std::string& name) {
  for (const KernelCandidate& c : op.candidates)
    if (c.name == name) return &c;
  return nullptr;
}

void refuse_forced(const KernelOp& op, const std::string& name, const std::string& how_not, const std::string& src) {
  if (op.refuse) op.refuse(name, how_not, src);
  std::string list;
  for (const KernelCandidate& c : op.candidates)
    list += (list.empty() ? "" : "; ") + c.name +
            (c.why_not.empty() ? " (runs here)" : " (not here: " + c.why_not + ")");
  throw Error(ErrorCode::Unsupported, src + ": " + op.op + "=" + name + " cannot be used: " + how_not + ". Candidates: " + list);
}

// The forced candidate after the check ("" kernel with the failure in check where it fails; the caller throws).
KernelChoice forced_choice(const KernelOp& op, const KernelCandidate& k) {
  KernelChoice c{op.op, k.name, "", 0, k.instruction, op.unit};
  if (k.name == op.yardstick) {  // the check's reference
    if (op.time_lone) c.gflops = op.bench()->rate(k.name, true);
    return c;
  }
  const std::unique_ptr<KernelBench> b = op.bench();
  std::string fail;
  const KernelAccuracy a = b->check(k.name, &fail);
  if (!a.ok()) return {op.op, "", "", 0, "", op.unit, fail};
  c.check = accuracy_summary(op.yardstick, b->shape(), {{k.name, a.ratio}});
  if (op.time_lone) c.gflops = b->rate(k.name, true);
  return c;
}

// Every runnable candidate but the yardstick is checked against it on the timing data; those within their bound are
// timed, in the order given, a later one taken only when more than kChoiceMargin times faster (isa.h).
KernelChoice timed_choice(const KernelOp& op) {
  const KernelCandidate* yard = find(op, op.yardstick);
  const std::string yard_instr = yard ? yard->instruction : "";
  std::vector<const KernelCandidate*> run;
  for (const KernelCandidate& c : op.candidates)
    if (c.name != op.yardstick && c.why_not.empty()) run.push_back(&c);
  if (run.empty()) return {op.op, op.yardstick, op.none_why, 0, yard_instr, op.unit};
  const std::unique_ptr<KernelBench> b = op.bench();
  std::vector<std::pair<std::string, double>> passed;
  std::string rejected, list, fail;
  const KernelCandidate* best = nullptr;
  double best_rate = -1;
  for (const KernelCandidate* k : run) {
    const KernelAccuracy a = b->check(k->name, &fail);
    if (!a.ok()) {
      rejected += "; rejected: " + fail;
      continue;
    }
    passed.emplace_back(k->name, a.ratio);
    if (run.size() == 1 && !op.time_lone) {  // nothing to time it against
      best = k;
      break;
    }
    const double rate = b->rate(k->name, run.size() == 1);
    char r[32];
    std::snprintf(r, sizeof r, " %.1f", rate);
    list += (list.empty() ? "" : ", ") + k->name + r;
    if (best_rate < 0 || rate > kChoiceMargin * best_rate) best_rate = rate, best = k;
  }
  KernelChoice c;
  if (passed.empty())
    c = {op.op, op.yardstick, "the only kernel that passes the accuracy check", 0, yard_instr, op.unit};
  else if (run.size() == 1)
    c = {op.op, best->name, op.lone_why, std::max(best_rate, 0.0), best->instruction, op.unit};
  else
    c = {op.op, best->name, "fastest of " + list + " " + op.unit + " (1 thread, " + b->shape() + ")", best_rate,
         best->instruction, op.unit};
  if (!passed.empty() || !rejected.empty()) c.check = accuracy_summary(op.yardstick, b->shape(), passed) + rejected;
  return c;
}

}  // namespace

KernelChoice choose_kernel(const KernelOp& op, const KernelScope& scope) {
  const std::string& src = scope.source;
  std::string forced = forced_kernel(op.op, scope.kernels, src);
  if (forced.empty() && !op.fallback_op.empty()) forced = forced_kernel(op.fallback_op, scope.kernels, src);
  if (!forced.empty()) {
    const KernelCandidate* k = find(op, forced);
    if (!k || !k->why_not.empty()) refuse_forced(op, forced, k ? k->why_not : "unknown kernel", src);
  }
  static std::mutex mu;
  // The test-only perturbations get choices of their own (kernel_check.h).
  static std::map<std::tuple<std::string, std::string, uint32_t, std::string, std::string>, KernelChoice> cache;
  std::lock_guard<std::mutex> lk(mu);
  const auto key = std::make_tuple(op.op, op.cache_key, op.isa_key, forced, kernel_check_perturbations(op.op));
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, forced.empty() ? timed_choice(op) : forced_choice(op, *find(op, forced))).first;
  KernelChoice c = it->second;
  if (forced.empty()) return c;
  // A failure is kept with no kernel, thrown on every attempt.
  if (c.kernel.empty()) throw Error(ErrorCode::Unsupported, src + ": " + op.op + "=" + forced + " fails the accuracy check: " + c.check);
  c.why = "forced by " + src;
  return c;
}

}  // namespace alpamayo::cpu
