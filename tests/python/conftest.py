"""Fixtures: the CLI binary (fail loudly if missing, never skip) and the backends to test."""
from __future__ import annotations

import functools
import os
import sys
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
def compiled_backends() -> list[tuple[str, list[str]]]:
    """`alpamayo-expert backends`: every backend in this build with its weight formats. Each one is tested;
    a backend that errors fails its tests, it is never dropped from the matrix."""
    p = cli_path()
    if not p.is_file():
        return [("reference", ["f32"])]  # the `cli` fixture fails every test with a clear message
    r = run(p, "backends", timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{p} backends failed: {r.stderr.strip()}")
    out = []
    for line in r.stdout.splitlines():
        name, *formats = line.split()
        out.append((name, formats))
    return out


def backends(with_int8: bool = True) -> list[Backend]:
    out = []
    for name, formats in compiled_backends():
        for f in formats:
            if f == "int8" and not with_int8:
                continue
            out.append(REFERENCE if name == "reference" else Backend(name, f))
    return out


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        bs = backends()
        metafunc.parametrize("backend", bs, ids=[b.id for b in bs])


def pytest_report_header(config):
    return f"alpamayo-expert: {cli_path()}; backends: {', '.join(b.id for b in backends())}"
