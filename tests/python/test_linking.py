"""What the engine's binaries need from the system to start: no CUDA library (cuBLASLt is loaded on first use of
the cuda backend, the CUDA runtime is linked statically), so a CUDA-enabled build starts and runs its other backends
on a machine without the CUDA toolkit, and a process that never uses the cuda backend does not map those libraries
(docs/CUDA_BACKEND.md, "cuBLASLt, loaded on first use")."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import alpamayo_expert._core as core
from conftest import compiled_backends

CUDA_LIBRARY = re.compile(r"lib(cublas|cublasLt|cudart|cuda|nvrtc|cudnn|nccl)\b[^\]]*")


def needed(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF file (readelf, from binutils)."""
    exe = shutil.which("readelf")
    if exe is None:
        pytest.fail("readelf (binutils) is not installed: scripts/setup.sh installs build-essential, which has it")
    out = subprocess.run([exe, "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def binaries(cli: Path) -> list[Path]:
    out = [cli, Path(core.__file__)]
    # The C API's shared library beside the CLI (a CMake build tree).
    out += sorted(cli.parent.glob("libalpamayo_expert.so.*.*"))
    return out


def test_no_cuda_library_is_needed_to_start(cli):
    bins = binaries(cli)
    assert len(bins) >= 2
    for b in bins:
        libs = needed(b)
        assert libs, f"{b}: no NEEDED entries read"
        assert not [l for l in libs if CUDA_LIBRARY.match(l)], f"{b} needs {libs}"


def test_a_process_that_does_not_use_cuda_does_not_map_it(cli, tmp_path):
    """The CLI's `backends` lists the cuda backend where it is compiled in (and probes the driver), yet without a
    usable device it never loads cuBLASLt; on a machine with one the probe's success is what loads it."""
    env = dict(os.environ, LD_DEBUG="files", LD_DEBUG_OUTPUT=str(tmp_path / "ld"))
    r = subprocess.run([str(cli), "backends"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    loaded = "".join(p.read_text() for p in tmp_path.glob("ld*"))
    assert "libdnnl" in loaded or "libc.so" in loaded, "LD_DEBUG wrote nothing readable"
    cuda = {n: why for n, _, why in compiled_backends()}.get("cuda")
    if cuda is None or cuda:  # not compiled in, or unavailable here
        assert "libcublasLt" not in loaded, "cuBLASLt was mapped by a process that cannot use the cuda backend"
