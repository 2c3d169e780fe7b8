/* Fault injection for the output tests: an LD_PRELOAD library that makes one call of the output path fail.
 *
 * It wraps open/openat (for writing or creating), write, fsync, close, rename/renameat/renameat2 and
 * ftruncate/mmap, and counts the calls that concern files under ALPAMAYO_FAULT_DIR (descriptors opened
 * there for writing, paths there). The ALPAMAYO_FAULT_AT-th call (1-based) of kind ALPAMAYO_FAULT_CALL
 * fails with ALPAMAYO_FAULT_KIND:
 *   eio     returns -1 with errno EIO
 *   enospc  returns -1 with errno ENOSPC
 *   short   (write only) writes half of the bytes (at least 1) and returns that count
 * With ALPAMAYO_FAULT_COUNT=FILE, the number of calls of each kind is written to FILE at exit
 * ("write 12\nfsync 3\n..."). Built for the tests only; never linked into the engine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

enum { K_OPEN, K_WRITE, K_FSYNC, K_CLOSE, K_RENAME, K_FTRUNCATE, K_MMAP, K_N };
static const char* const kNames[K_N] = {"open", "write", "fsync", "close", "rename", "ftruncate", "mmap"};
static long g_count[K_N];
static int g_fail_kind = -1;  /* which call kind fails */
static long g_fail_at = 0;
static int g_mode = 0;        /* 0 eio, 1 enospc, 2 short */
static char g_dir[PATH_MAX];
static size_t g_dir_len = 0;
static int g_ready = 0;
enum { kMaxFd = 65536 };
static unsigned char g_tracked[kMaxFd];

static void init(void) {
  if (g_ready) return;
  g_ready = 1;
  const char* d = getenv("ALPAMAYO_FAULT_DIR");
  if (d && *d && strlen(d) < sizeof g_dir) {
    strcpy(g_dir, d);
    g_dir_len = strlen(g_dir);
    while (g_dir_len > 1 && g_dir[g_dir_len - 1] == '/') g_dir[--g_dir_len] = 0;
  }
  const char* c = getenv("ALPAMAYO_FAULT_CALL");
  for (int k = 0; c && k < K_N; ++k)
    if (strcmp(c, kNames[k]) == 0) g_fail_kind = k;
  const char* at = getenv("ALPAMAYO_FAULT_AT");
  g_fail_at = at ? atol(at) : 0;
  const char* m = getenv("ALPAMAYO_FAULT_KIND");
  g_mode = m && strcmp(m, "enospc") == 0 ? 1 : m && strcmp(m, "short") == 0 ? 2 : 0;
}

__attribute__((destructor)) static void report(void) {
  const char* f = getenv("ALPAMAYO_FAULT_COUNT");
  if (!f || !*f) return;
  char buf[512];
  int n = 0;
  for (int k = 0; k < K_N; ++k) n += snprintf(buf + n, sizeof buf - n, "%s %ld\n", kNames[k], g_count[k]);
  const int fd = (int)syscall(SYS_openat, AT_FDCWD, f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!syscall(SYS_write, fd, buf, (size_t)n);
  syscall(SYS_close, fd);
}

/* Whether path (relative to dirfd) lies under the fault directory. */
static int under_dir(int dirfd, const char* path) {
  init();
  if (!g_dir_len || !path) return 0;
  char full[2 * PATH_MAX];
  if (path[0] == '/') {
    snprintf(full, sizeof full, "%s", path);
  } else {
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
      if (!getcwd(base, sizeof base)) return 0;
    } else {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      const ssize_t r = readlink(link, base, sizeof base - 1);
      if (r <= 0) return 0;
      base[r] = 0;
    }
    snprintf(full, sizeof full, "%s/%s", base, path);
  }
  return strncmp(full, g_dir, g_dir_len) == 0 && (full[g_dir_len] == '/' || full[g_dir_len] == 0);
}

static int tracked(int fd) { return fd >= 0 && fd < kMaxFd && g_tracked[fd]; }

/* Counts a call of kind k; 1 when this one is to fail. */
static int hit(int k) {
  init();
  const long n = __atomic_add_fetch(&g_count[k], 1, __ATOMIC_SEQ_CST);
  return k == g_fail_kind && n == g_fail_at;
}

static int fail_errno(void) { return g_mode == 1 ? ENOSPC : EIO; }

static int do_openat(int dirfd, const char* path, int flags, mode_t mode) {
  const int writes = (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0;
  if (writes && under_dir(dirfd, path)) {
    if (hit(K_OPEN)) {
      errno = fail_errno();
      return -1;
    }
    const int fd = (int)syscall(SYS_openat, dirfd, path, flags, mode);
    if (fd >= 0 && fd < kMaxFd) g_tracked[fd] = 1;
    return fd;
  }
  return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

int openat(int dirfd, const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  return do_openat(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) __attribute__((alias("openat")));

int open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  return do_openat(AT_FDCWD, path, flags, mode);
}
int open64(const char* path, int flags, ...) __attribute__((alias("open")));

ssize_t write(int fd, const void* buf, size_t n) {
  if (tracked(fd) && hit(K_WRITE)) {
    if (g_mode == 2) return (ssize_t)syscall(SYS_write, fd, buf, n > 1 ? n / 2 : n);
    errno = fail_errno();
    return -1;
  }
  return (ssize_t)syscall(SYS_write, fd, buf, n);
}

int fsync(int fd) {
  if (tracked(fd) && hit(K_FSYNC)) {
    errno = fail_errno();
    return -1;
  }
  return (int)syscall(SYS_fsync, fd);
}

int close(int fd) {
  if (tracked(fd)) {
    g_tracked[fd] = 0;
    if (hit(K_CLOSE)) {  /* as Linux does: the descriptor is closed all the same */
      syscall(SYS_close, fd);
      errno = fail_errno();
      return -1;
    }
  }
  return (int)syscall(SYS_close, fd);
}

int ftruncate(int fd, off_t len) {
  if (tracked(fd) && hit(K_FTRUNCATE)) {
    errno = fail_errno();
    return -1;
  }
  return (int)syscall(SYS_ftruncate, fd, len);
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (tracked(fd) && hit(K_MMAP)) {
    errno = fail_errno();
    return MAP_FAILED;
  }
  return (void*)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static int rename_hit(int olddirfd, const char* oldpath) {
  return under_dir(olddirfd, oldpath) && hit(K_RENAME);
}

int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned int flags) {
  if (rename_hit(olddirfd, oldpath)) {
    errno = fail_errno();
    return -1;
  }
  return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

int renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  return renameat2(olddirfd, oldpath, newdirfd, newpath, 0);
}

int rename(const char* oldpath, const char* newpath) { return renameat2(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0); }
