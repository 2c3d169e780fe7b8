"""The engine's errors: one class per kind of failure, the same kinds as the C API's statuses (docs/PYTHON.md).

Every class derives from `Error` (a RuntimeError, as the engine's single error class was before) and from the
builtin exception a Python caller expects for that kind, so `except ValueError` or `except OSError` catch what
they should. `code` names the kind as the C API does (ALPAMAYO_IO_ERROR: "io_error"). The native module raises
these (an alpamayo::Error's code picks the class); this module needs neither torch nor the native module.
"""
from __future__ import annotations

__all__ = ["Error", "InvalidArgumentError", "FormatError", "FileIOError", "UnsupportedError", "OutOfMemoryError",
           "NonFiniteError", "InvalidStateError", "InternalError", "ERRORS"]


class Error(RuntimeError):
    """An error of the engine: the message names the file, tensor or key, what was expected and what was found."""

    code: str | None = None


class InvalidArgumentError(Error, ValueError):
    """A value the caller passed (an option, a tensor, a shape, a path) is not acceptable."""

    code = "invalid_argument"


class FormatError(Error, ValueError):
    """A file was read but is malformed: its header, JSON, a tensor's dtype or shape, a config key."""

    code = "format_error"


class FileIOError(Error, OSError):
    """A path is missing or cannot be read or written (errno is not set: the message says why)."""

    code = "io_error"


class UnsupportedError(Error, NotImplementedError):
    """An unknown backend, format or kernel; a feature the engine or the backend does not run; memory the backend
    cannot read; a backend that cannot run on this machine."""

    code = "unsupported"


class OutOfMemoryError(Error, MemoryError):
    """A memory estimate over what is available (ALPAMAYO_MEMORY_LIMIT, ulimit -v, the machine) or a failed
    allocation; the message names the stage."""

    code = "out_of_memory"


class NonFiniteError(Error, FloatingPointError, ValueError):
    """NaN or Inf in an input (cache, noise, ego history, v0, weights) or in a velocity or trajectory the engine
    computed from finite inputs."""

    code = "non_finite"


class InvalidStateError(Error):
    """A call out of order: sampling before bind, captures or steps that were not requested."""

    code = "invalid_state"


class InternalError(Error):
    """A broken invariant of the engine itself (a bug)."""

    code = "internal"


# By code, in the order of alpamayo::ErrorCode (error.h); the native module maps a code to its class through it.
ERRORS: tuple[type[Error], ...] = (InvalidArgumentError, FormatError, FileIOError, UnsupportedError, OutOfMemoryError,
                                   NonFiniteError, InvalidStateError, InternalError)
