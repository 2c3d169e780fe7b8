"""Where the TT-Lang operations run: `tt-sim` (tt-lang-sim, no hardware) or `tt` (a Blackhole through tt-lang)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedError

BACKENDS = ("tt-sim", "tt")


@dataclass
class Runtime:
    backend: str
    ttl: Any
    ttnn: Any
    device: Any


def _import_simulator():
    import torch

    # tt-lang-sim rebinds torch.bfloat16 / torch.float16 to float32 for the whole process when it is imported;
    # put them back so that code beside it keeps its dtypes (the simulator keeps its own aliases and still
    # computes in float32).
    saved = {n: getattr(torch, n) for n in ("bfloat16", "float16")}
    try:
        from ttl.sim import ttl, ttnn
    except ImportError as e:
        raise UnsupportedError("backend tt-sim: the simulator is not installed (pip install 'alpamayo-expert[tt-sim]', "
                               f"which brings tt-lang-sim): {e}") from None
    finally:
        for n, v in saved.items():
            setattr(torch, n, v)
    _plain_kernel_errors()
    return ttl, ttnn


def _plain_kernel_errors() -> None:
    """tt-lang-sim 1.1.6 formats a kernel's error with a module its wheel does not ship (ttl/ttl/diagnostics.py),
    which hides the error behind a FileNotFoundError; print it plainly instead (the exception still follows)."""
    import sys

    from ttl.sim import diagnostics, greenlet_scheduler, program

    def plain(name, message, source_file, source_line, source_col=1):
        print(f"{source_file}:{source_line}:{source_col}: {name}: {message}", file=sys.stderr)

    try:
        diagnostics.lazy_import_diagnostics()
    except (ImportError, OSError):
        diagnostics.print_diagnostic_error = plain
        program.print_diagnostic_error = plain
        greenlet_scheduler.print_diagnostic_error = plain


def _import_hardware():
    try:
        import ttl
        import ttnn
    except ImportError as e:
        raise UnsupportedError("backend tt: needs tt-lang and ttnn (pip install 'alpamayo-expert[tt]') and a "
                               f"Tenstorrent Blackhole: {e}") from None
    if getattr(ttl, "_SIM_ONLY_INSTALL", False):
        raise UnsupportedError("backend tt: the installed ttl is the simulator-only wheel (tt-lang-sim); install "
                               "tt-lang on a machine with a Blackhole, or use backend tt-sim")
    try:
        n = ttnn.GetNumAvailableDevices()
    except Exception as e:  # noqa: BLE001 - any driver failure means no usable chip
        raise UnsupportedError(f"backend tt: no Tenstorrent device reachable: {e}") from None
    if n < 1:
        raise UnsupportedError("backend tt: no Tenstorrent device found")
    return ttl, ttnn


def open_runtime(backend: str) -> Runtime:
    if backend == "tt-sim":
        ttl, ttnn = _import_simulator()
    elif backend == "tt":
        ttl, ttnn = _import_hardware()
    else:
        raise UnsupportedError(f"unknown TT backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    device = ttnn.open_device(device_id=0)
    if backend == "tt":
        arch = str(getattr(device, "arch", lambda: "")()).lower()
        if "blackhole" not in arch:
            ttnn.close_device(device)
            raise UnsupportedError(f"backend tt: the device is not a Blackhole ({arch or 'unknown arch'})")
    return Runtime(backend, ttl, ttnn, device)
