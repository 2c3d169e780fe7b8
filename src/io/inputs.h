// Opening untrusted input files: regular files only (checked before anything can block), bounded reads,
// strict JSON (no duplicate keys, bounded nesting), shard paths confined to their checkpoint directory.
#pragma once
#include <sys/stat.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace alpamayo {

// Opens path read-only. Anything but a regular file (directory, named pipe, socket, device) is refused
// before it is opened, and the open itself is non-blocking, so a named pipe swapped in between fails at
// the fstat check instead of blocking. Symbolic links are followed (a checkpoint from the Hugging Face cache
// is a directory of links). Returns the descriptor and fills *st; throws Error naming the file.
int open_regular_file(const std::string& path, struct stat* st);

// A new descriptor never stays 0, 1 or 2: one of them is free only when the process started with it closed,
// and a file opened there would receive what is printed to stdin/stdout/stderr. Moves fd to the lowest free
// descriptor >= 3 (close-on-exec) and returns it; returns fd when it is < 0 or >= 3, -1 (errno set) on failure.
int fd_above_standard(int fd);

// A path given as std::string may hold a NUL byte, which the system call would take as its end (the file
// opened would be another one): such a path is an error naming `what` and the path with the NUL escaped.
void check_no_nul(const std::string& path, const std::string& what);

// "a directory", "a named pipe", ... for messages.
const char* file_type_name(mode_t mode);

// Reads a whole regular file of at most max_bytes bytes.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

// Parses JSON text strictly: syntax, valid UTF-8, no duplicate keys in any object, nesting at most
// max_depth deep. Throws Error("<what>: ...").
nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& what, int max_depth = 64);

// read_regular_file + parse_json_strict; JSON files are limited to 64 MiB.
nlohmann::json read_json_file_strict(const std::string& path);

// Quotes an untrusted string for an error message: control and non-ASCII bytes escaped, at most max_len
// characters kept.
std::string quote_untrusted(const std::string& s, size_t max_len = 200);

// The path of a shard named by model.safetensors.index.json: the name must be relative and stay inside the
// checkpoint directory (no empty, "." or ".." components, no absolute path, no NUL). Throws Error naming
// the index file and the tensor key otherwise.
std::string confined_shard_path(const std::string& dir, const std::string& name, const std::string& index_path,
                                const std::string& key);

}  // namespace alpamayo
