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
def compiled_backends() -> list[tuple[str, list[str], str]]:
    """`alpamayo-expert backends`: every backend in this build with its weight formats (its KV cache formats, after
    "; kv", are not part of this matrix). Each one is tested; a backend that errors fails its tests, it is never
    dropped from the matrix."""
    p = cli_path()
    if not p.is_file():
        return [("reference", ["f32"], "")]  # the `cli` fixture fails every test with a clear message
    r = run(p, "backends", timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{p} backends failed: {r.stderr.strip()}")
    out = []
    for line in r.stdout.splitlines():
        spec, _, why = line.partition(" -- unavailable: ")
        spec, _, _kv = spec.partition("; kv")
        name, *formats = spec.split()
        out.append((name, formats, why))
    return out


def backends(with_int8: bool = True) -> list:
    """The test matrix: every compiled backend and format; one that cannot run on this machine (a GPU
    backend without a GPU) is reported as skipped with the reason, never passed and never dropped."""
    out = []
    for name, formats, why in compiled_backends():
        for f in formats:
            if f == "int8" and not with_int8:
                continue
            b = REFERENCE if (name, f) == ("reference", "f32") else Backend(name, f)
            out.append(pytest.param(b, id=b.id, marks=pytest.mark.skip(reason=f"{b.id}: {why}")) if why else b)
    return out


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", backends(), ids=lambda b: b.id)


def pytest_report_header(config):
    names = [f"{n} ({', '.join(f)}{'; unavailable: ' + why if why else ''})" for n, f, why in compiled_backends()]
    return f"alpamayo-expert: {cli_path()}; backends: {'; '.join(names)}"
