"""Fixtures: the CLI binary (fail loudly if missing, never skip) and the backends to test."""
from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("ALPAMAYO_TORCH_THREADS", "2")))

from cli import REFERENCE, Backend, cli_path, run  # noqa: E402


def _missing_cli_message(p: Path) -> str:
    return (f"alpamayo-expert CLI not found or not executable at {p}. Build it "
            f"(cmake -S . -B build && cmake --build build --target alpamayo-expert) or set ALPAMAYO_CLI.")


@pytest.fixture(scope="session")
def cli() -> Path:
    p = cli_path()
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(_missing_cli_message(p), pytrace=False)
    return p


@functools.lru_cache(maxsize=None)
def cpu_backend_status() -> tuple[bool, str]:
    """Try `sample --backend cpu` on a tiny case: (available, why)."""
    p = cli_path()
    if not p.is_file():
        return False, "CLI missing"
    from synth import CtxSpec, make_checkpoint, make_context, make_noise
    from alpamayo_expert import write_noise
    with tempfile.TemporaryDirectory() as d:
        make_checkpoint(f"{d}/ck", dtype="bf16")
        make_context(f"{d}/ctx.safetensors", spec=CtxSpec(motion="v0"))
        write_noise(f"{d}/noise.safetensors", make_noise(3))
        r = run(p, "sample", "--checkpoint", f"{d}/ck", "--context", f"{d}/ctx.safetensors", "--noise",
                f"{d}/noise.safetensors", "--backend", "cpu", "--out", f"{d}/o.safetensors", timeout=300)
    if r.returncode < 0:  # a crash is a bug in an existing backend: keep it in the matrix so tests fail
        return True, f"crashed with signal {-r.returncode}"
    if r.returncode != 0:
        return False, r.stderr.strip()[-300:]
    return True, "ok"


def backends(with_int8: bool = True) -> list[Backend]:
    out = [REFERENCE]
    if cpu_backend_status()[0]:
        out.append(Backend("cpu", "bf16"))
        if with_int8:
            out.append(Backend("cpu", "int8"))
    return out


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        bs = backends()
        metafunc.parametrize("backend", bs, ids=[b.id for b in bs])


def pytest_report_header(config):
    ok, why = cpu_backend_status()
    return f"alpamayo-expert: {cli_path()}; cpu backend: {'available' if ok else 'not available'} ({why})"
