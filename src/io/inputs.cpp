#include "io/inputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "alpamayo/error.h"

namespace alpamayo {

const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

int fd_above_standard(int fd) {
  if (fd < 0 || fd > 2) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  const int err = errno;
  ::close(fd);
  errno = err;
  return moved;
}

void check_no_nul(const std::string& path, const std::string& what) {
  const size_t at = path.find('\0');
  if (at == std::string::npos) return;
  throw Error(what + ": embedded null byte in the path '" + quote_untrusted(path) + "' (at byte " +
              std::to_string(at) + "); a path cannot contain NUL");
}

int open_regular_file(const std::string& path, struct stat* st) {
  check(!path.empty(), "empty file name");
  check_no_nul(path, "file name");
  // stat first: never open a pipe or a device (opening one can block or have side effects).
  if (::stat(path.c_str(), st) != 0) throw Error(ErrorCode::IO, path + ": cannot open (" + std::strerror(errno) + ")");
  check(S_ISREG(st->st_mode), ErrorCode::IO,
        path + ": is " + file_type_name(st->st_mode) + ", expected a regular file");
  // O_NONBLOCK: if a pipe replaced the file since the stat, open returns at once and fstat refuses it.
  const int fd = fd_above_standard(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd < 0) throw Error(ErrorCode::IO, path + ": cannot open (" + std::strerror(errno) + ")");
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    const mode_t m = st->st_mode;
    ::close(fd);
    throw Error(ErrorCode::IO, path + ": is " + file_type_name(m) + ", expected a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  struct stat st {};
  const int fd = open_regular_file(path, &st);
  std::string out;
  try {
    check(static_cast<uint64_t>(st.st_size) <= max_bytes, ErrorCode::Format,
          path + ": " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
              "-byte limit for this file");
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    for (;;) {
      if (got == out.size()) {  // the file may have grown since the fstat: read on, within the limit
        check(out.size() < max_bytes, ErrorCode::Format,
              path + ": more than the " + std::to_string(max_bytes) + "-byte limit for this file");
        out.resize(std::min<uint64_t>(max_bytes, out.size() + 4096));
      }
      const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error(ErrorCode::IO, path + ": read failed (" + std::strerror(errno) + ")");
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    out.resize(got);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& what, int max_depth) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // keys seen in each open object
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        check(depth < max_depth, ErrorCode::Format,
              what + ": invalid JSON (nested more than " + std::to_string(max_depth) + " levels deep)");
        keys.emplace_back();
        break;
      case json::parse_event_t::array_start:
        check(depth < max_depth, ErrorCode::Format,
              what + ": invalid JSON (nested more than " + std::to_string(max_depth) + " levels deep)");
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        check(!keys.empty() && keys.back().insert(k).second, ErrorCode::Format,
              what + ": invalid JSON (duplicate key '" + quote_untrusted(k) + "')");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::Format, what + ": invalid JSON (" + e.what() + ")");
  }
}

nlohmann::json read_json_file_strict(const std::string& path) {
  const std::string text = read_regular_file(path, 64ull << 20);
  return parse_json_strict(text.data(), text.data() + text.size(), path);
}

std::string quote_untrusted(const std::string& s, size_t max_len) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string confined_shard_path(const std::string& dir, const std::string& name, const std::string& index_path,
                                const std::string& key) {
  const std::string where = index_path + ": weight_map['" + quote_untrusted(key) + "'] = '" + quote_untrusted(name) + "'";
  check(!name.empty(), ErrorCode::Format, where + ": empty shard file name");
  check(name.find('\0') == std::string::npos, ErrorCode::Format, where + ": shard file name contains a NUL byte");
  check(name[0] != '/', ErrorCode::Format,
        where + ": absolute path; shard files must be inside the checkpoint directory");
  size_t pos = 0;
  while (pos <= name.size()) {
    const size_t slash = std::min(name.find('/', pos), name.size());
    const std::string part = name.substr(pos, slash - pos);
    check(!part.empty() && part != "." && part != "..", ErrorCode::Format,
          where + ": shard file names must stay inside the checkpoint directory (no '..', '.' or empty components)");
    pos = slash + 1;
  }
  return dir + (dir.empty() || dir.back() == '/' ? "" : "/") + name;
}

}  // namespace alpamayo
