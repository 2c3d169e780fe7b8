// Strict numbers on the command line. CLI11 alone turns "-1" or "18446744073709551616" into 2^64 - 1 for an
// unsigned option and accepts "nan" and "inf" for a floating-point one (its Range check lets NaN through).
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "commands.h"

namespace alpamayo::cli {

CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "'" + s + "' is not a non-negative integer";
        errno = 0;
        char* end = nullptr;
        (void)std::strtoull(s.c_str(), &end, 10);
        if (errno == ERANGE || *end != '\0') return s + " is out of range [0, 18446744073709551615]";
        return "";
      },
      "UINT64");
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end == s.c_str() || *end != '\0') return "'" + s + "' is not a number";
        if (!std::isfinite(v) || errno == ERANGE) return s + " is not a finite number";
        return "";
      },
      "FINITE");
}

}  // namespace alpamayo::cli
