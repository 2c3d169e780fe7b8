"""Atomic, exclusive writes: a reader never sees a half-written file, and a write never destroys anything.

The same rules as the C++ output module (include/alpamayo/output.h, docs/SECURITY.md):
- the target must name a file; an existing target must be a regular file, not a symbolic link, a directory,
  a device or a pipe (``/dev/null`` is refused, never replaced), and not one of the caller's ``inputs``
  (compared by device and inode, so another spelling or a hard link is caught);
- the temporary file is created in the target's directory with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under an
  unpredictable name (``.NAME.<12 random characters>.tmp``, from ``secrets``), relative to a descriptor of that
  directory opened once, and written through its own descriptor: it is never reopened by a name somebody
  else could replace with a link;
- the data is synced, the target checked again and the temporary file renamed over it; on any failure
  (including KeyboardInterrupt) the temporary file is removed and the target is left as it was.
"""
from __future__ import annotations

import fcntl
import os
import secrets
import stat
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from safetensors.torch import save


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def checked_path(path: str | os.PathLike, name: str = "path") -> str:
    """os.fspath(path), refused with ValueError naming the argument when it holds a NUL byte (as Python's
    open() refuses it: the system call would stop at the NUL and open another file)."""
    raw = os.fspath(path)
    nul = "\0" if isinstance(raw, str) else b"\0"
    if nul in raw:
        raise ValueError(f"{name}: embedded null byte in the path {raw!r} (at position {raw.index(nul)}); "
                         "a path cannot contain NUL")
    return raw


def check_target(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Raises ValueError unless `path` may be written: it names a file whose directory exists, and an
    existing file there is a regular file (not a link) that is none of `inputs`."""
    raw = checked_path(path)
    if not raw:
        raise ValueError("empty output path")
    p = Path(raw)
    if raw.endswith(os.sep) or p.name in ("", ".", ".."):
        raise ValueError(f"{raw}: names a directory, expected a file name")
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{raw}: the directory {parent} does not exist")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{raw}: is {_kind(st.st_mode)}, expected a regular file; refusing to replace it")
    if st is not None:
        for inp in inputs:
            try:
                si = os.stat(inp)
            except OSError:
                continue
            if (si.st_dev, si.st_ino) == (st.st_dev, st.st_ino):
                raise ValueError(f"{raw}: is the input {os.fspath(inp)}; refusing to overwrite an input")
    return p


def _above_standard(fd: int) -> int:
    """fd moved to a descriptor >= 3 (close-on-exec): a process started with 0, 1 or 2 closed must not get its
    output file there, or whatever it prints would land in the file."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _write_exclusive(path: str | os.PathLike, fill: Callable[[int], None], inputs: Iterable = ()) -> Path:
    """Creates an exclusive temporary file next to `path`, lets fill(fd) write it, then renames it over `path`."""
    inputs = list(inputs)
    p = check_target(path, inputs)
    dir_fd = _above_standard(os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    name = None
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(100):
            candidate = f".{p.name}.{secrets.token_urlsafe(9)}.tmp"  # 12 characters, 72 random bits
            try:
                fd = os.open(candidate, flags, 0o666, dir_fd=dir_fd)
            except FileExistsError:  # a file or a planted link under that name: never followed, try another
                continue
            name = candidate
            fd = _above_standard(fd)
            break
        else:
            raise OSError(f"{p}: could not create a temporary file in {p.parent} (100 names taken)")
        try:
            fill(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        check_target(p, inputs)  # again: the target may have changed while the data was written
        os.replace(name, p.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        name = None
        os.fsync(dir_fd)
    except BaseException:
        if name is not None:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        raise
    finally:
        os.close(dir_fd)
    return p


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def save_safetensors_atomic(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike,
                            metadata: Mapping[str, str] | None = None,
                            inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Write `tensors` to `path` exclusively and atomically (module docstring); `inputs` may not be replaced."""
    checked_path(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # safetensors refuses non-contiguous tensors and tensors sharing storage.
    prepared = {k: v.detach().contiguous().cpu().clone() for k, v in tensors.items()}
    meta = dict(metadata) if metadata else None

    # Serialized in memory and written through the exclusive descriptor: safetensors' save_file would
    # create its own temporary file by name in the directory.
    data = save(prepared, metadata=meta)
    return _write_exclusive(path, lambda fd: _write_all(fd, data), inputs)


def write_text_atomic(path: str | os.PathLike, text: str, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Write `text` (UTF-8) to `path` exclusively and atomically (module docstring)."""
    checked_path(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    return _write_exclusive(path, lambda fd: _write_all(fd, data), inputs)
