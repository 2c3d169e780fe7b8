// Errors raised by the library. Library code never aborts or exits: every failure is an
// alpamayo::Error whose message names the file, tensor or key, what was expected and what was found, and whose
// code says what kind of failure it is. The code is set where the error is raised, so the C API
// (alpamayo_status) and Python (one exception class per code) map it one to one instead of guessing.
#pragma once
#include <stdexcept>
#include <string>

namespace alpamayo {

enum class ErrorCode {
  InvalidArgument,  // a value the caller passed (an option, a tensor, a shape) is not acceptable
  Format,           // a file was read but its content is malformed (header, JSON, a tensor's size or dtype)
  IO,               // a path is missing or cannot be read or written
  Unsupported,      // an unknown backend or format, a feature a backend does not run, memory it cannot read,
                    // a backend that cannot run on this machine
  OutOfMemory,      // a memory estimate that does not fit (check_memory) or a failed allocation
  NonFinite,        // NaN or Inf in inputs, weights, caches, noise or a velocity
  InvalidState,     // a call out of order (sample before bind, captures that were not requested)
  Internal,         // a broken invariant of the library itself
};

// "invalid argument", "format error", ...: the names alpamayo_status_name gives the matching statuses.
inline const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument: return "invalid argument";
    case ErrorCode::Format: return "format error";
    case ErrorCode::IO: return "I/O error";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::OutOfMemory: return "out of memory";
    case ErrorCode::NonFinite: return "non-finite value";
    case ErrorCode::InvalidState: return "invalid state";
    case ErrorCode::Internal: return "internal error";
  }
  return "unknown error";
}

class Error : public std::runtime_error {
 public:
  // Without a code: invalid argument, the most common failure.
  explicit Error(const std::string& msg) : Error(ErrorCode::InvalidArgument, msg) {}
  Error(ErrorCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(msg) (invalid argument) when cond is false. A function, not a macro, so messages stay explicit
// at call sites.
inline void check(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

// Throws Error(code, msg) when cond is false.
inline void check(bool cond, ErrorCode code, const std::string& msg) {
  if (!cond) throw Error(code, msg);
}

}  // namespace alpamayo
