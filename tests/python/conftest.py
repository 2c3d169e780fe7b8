"""Fixtures: the CLI binary (fail loudly if missing, never skip) and the backends to test."""
from __future__ import annotations

import functools
import os
import re
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


@pytest.fixture(scope="session", autouse=True)
def pinned_cpu_kernels():
    """The cpu backend times its kernels in each process; where two are close, processes can choose differently,
    with results that differ in rounding. The tests compare this process's results with the CLI's bit for bit, so
    the session pins the choices that `inspect --kernels` makes here, as a user would (unless they are pinned
    already). The tests of the timed choice itself unset it."""
    p = cli_path()
    if os.environ.get("ALPAMAYO_CPU_KERNELS") or not p.is_file():
        yield None
        return
    from synth import make_checkpoint
    with tempfile.TemporaryDirectory() as d:
        r = run(p, "inspect", make_checkpoint(Path(d) / "ck"), "--kernels", timeout=300)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^cpu pin\s+ALPAMAYO_CPU_KERNELS=(\S+)$", r.stdout, re.M)
    if m is None:  # no cpu backend in this build
        yield None
        return
    os.environ["ALPAMAYO_CPU_KERNELS"] = m.group(1)
    yield m.group(1)
    del os.environ["ALPAMAYO_CPU_KERNELS"]


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)
def backend_listing() -> dict:
    """`alpamayo-expert backends`, parsed: name -> (weight formats, KV cache formats, features, why it cannot run
    here or "")."""
    p = cli_path()
    if not p.is_file():  # the `cli` fixture fails every test with a clear message
        return {"reference": (["f32"], ["f32"], ["shared-prompts", "suffix-rows", "left-padding", "guidance"], "")}
    r = run(p, "backends", timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{p} backends failed: {r.stderr.strip()}")
    out = {}
    for line in r.stdout.splitlines():
        spec, _, why = line.partition(" -- unavailable: ")
        spec, _, _runs_here = spec.partition("; runs")  # the formats this machine runs, where not all
        spec, _, features = spec.partition("; features")
        spec, _, kv = spec.partition("; kv")
        name, *formats = spec.split()
        out[name] = (formats, kv.split(), features.split(), why)
    return out


@functools.lru_cache(maxsize=None)
def compiled_backends() -> list[tuple[str, list[str], str]]:
    """Every backend in this build with its weight formats (its KV cache formats are not part of this matrix). Each
    one is tested; a backend that errors fails its tests, it is never dropped from the matrix."""
    return [(name, formats, why) for name, (formats, _kv, _f, why) in backend_listing().items()]


def require_features(backend, *features: str) -> None:
    """Skips the calling test, naming the backend and the feature, when the backend does not declare every one of
    `features` ("shared-prompts", "suffix-rows", "left-padding", "guidance"): Session::bind refuses such a context
    (tests/cpp/test_backend_features.cpp), so it is a case the backend does not run, not a failure."""
    declared = backend_listing()[backend.name][2]
    for f in features:
        if f not in declared:
            pytest.skip(f"{backend.name} does not declare {f}")


# The cpu backend's ops whose kernel a weight format's run depends on (the block formats decode in kernels of
# their own, chosen by instruction set, not among these).
KERNEL_OPS = {"bf16": ("attention", "matmul_bf16"), "int8": ("attention", "matmul_int8"),
              "bfp8_b": ("attention",), "bfp4_b": ("attention",)}


@functools.lru_cache(maxsize=None)
def kernel_candidates(op: str) -> list[tuple[str, str]]:
    """The engine's own kernel list for a cpu op, as its error for an unknown kernel names it, each with the reason
    it cannot run on this machine ("" where it can). Kernels for the other cache or weight type are left out: they
    are not candidates of this op."""
    p = cli_path()
    if not p.is_file():
        return []
    from synth import make_checkpoint
    with tempfile.TemporaryDirectory() as d:
        ck = make_checkpoint(Path(d) / "ck")
        probe = lambda k: run(p, "inspect", ck, "--kernels", timeout=300,  # noqa: E731
                              env={"ALPAMAYO_CPU_KERNELS": f"{op}={k}"}).stderr
        msg = probe("?")
        out = []
        if op.startswith("attention"):
            m = re.search(r"the attention kernels are ([\w, ]+) \(runnable here: ([\w, ]*)\)", msg)
            assert m, msg
            runnable = m.group(2).split(", ")
            for k in m.group(1).split(", "):
                why = "" if k in runnable else re.sub(r"^.*cannot run here: ([^;]*).*$", r"\1", probe(k).strip())
                if not why.startswith("reads only"):
                    out.append((k, why))
        else:
            m = re.search(r"Candidates: (.*)$", msg.strip())
            assert m, msg
            for item in m.group(1).split("; "):
                k, _, why = item.partition(" (")
                why = why.rstrip(")")
                if "weights only" not in why:
                    out.append((k, "" if why == "runs here" else why.removeprefix("not here: ")))
    return out


def backends(with_int8: bool = True, every_kernel: bool = False) -> list:
    """The test matrix: every compiled backend and format; one that cannot run on this machine (a GPU
    backend without a GPU) is reported as skipped with the reason, never passed and never dropped.
    every_kernel: the cpu backend also once per kernel of each op its format uses, forced (the timed choice of
    this machine is one of them; a kernel this machine cannot run is reported as skipped with the reason)."""
    out = []
    for name, formats, why in compiled_backends():
        for f in formats:
            if f == "int8" and not with_int8:
                continue
            b = REFERENCE if (name, f) == ("reference", "f32") else Backend(name, f)
            out.append(pytest.param(b, id=b.id, marks=pytest.mark.skip(reason=f"{b.id}: {why}")) if why else b)
            if every_kernel and name == "cpu" and not why:
                for op in KERNEL_OPS.get(f, ()):
                    for k, kwhy in kernel_candidates(op):
                        bk = Backend(name, f, f"{op}={k}")
                        out.append(pytest.param(bk, id=bk.id, marks=pytest.mark.skip(
                            reason=f"{bk.id}: this CPU cannot run {k}: {kwhy}")) if kwhy else bk)
    return out


def pytest_configure(config):
    config.addinivalue_line("markers", "every_kernel: run the cpu backend once per kernel of each op, forced")


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        every = metafunc.definition.get_closest_marker("every_kernel") is not None
        metafunc.parametrize("backend", backends(every_kernel=every), ids=lambda b: b.id)


def pytest_report_header(config):
    names = [f"{n} ({', '.join(f)}{'; unavailable: ' + why if why else ''})" for n, f, why in compiled_backends()]
    return f"alpamayo-expert: {cli_path()}; backends: {'; '.join(names)}"


def spec_features(spec, guided: bool = False) -> list[str]:
    """The context features a synth.CtxSpec needs (BackendFeatures in include/alpamayo/backend.h)."""
    out = []
    if spec.prompt_index is not None and (spec.G != spec.B or list(spec.prompt_index) != list(range(spec.B))):
        out.append("shared-prompts")
    if spec.suffix_rows > 0:
        out.append("suffix-rows")
    if spec.prefix_pad is not None and any(p > 0 for p in spec.prefix_pad):
        out.append("left-padding")
    if guided:
        out.append("guidance")
    return out

