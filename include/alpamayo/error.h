// Errors raised by the library. Library code never aborts or exits: every failure is an
// alpamayo::Error whose message names the file, tensor or key, what was expected and what was found.
#pragma once
#include <stdexcept>
#include <string>

namespace alpamayo {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error(msg) when cond is false. A function, not a macro, so messages stay explicit at call sites.
inline void check(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

}  // namespace alpamayo
