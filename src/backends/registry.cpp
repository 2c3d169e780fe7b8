#include "alpamayo/backend.h"
#include "alpamayo/error.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/reference/reference_backend.h"

namespace alpamayo {

std::vector<std::string> backend_names() { return {"cpu", "reference"}; }

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opts) {
  if (name == "cpu") return make_cpu_backend(opts);
  if (name == "reference") return make_reference_backend(opts);
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown backend '" + name + "' (available: " + known + ")");
}

}  // namespace alpamayo
