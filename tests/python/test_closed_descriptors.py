"""The CLI started with stdin, stdout and stderr closed: outputs equal a normal run's, no progress text lands in
a file, a failure still exits non-zero and leaves nothing behind."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from cli import SANITIZER_MARKS, run

SIZES = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--mlp", "128",
         "--ain-hidden", "32", "--waypoints", "8"]

# Which descriptors to close: "<&-" stdin, ">&-" stdout, "2>&-" stderr.
CLOSINGS = {"all": "<&- >&- 2>&-", "stdout+stderr": ">&- 2>&-", "stderr": "2>&-", "stdin": "<&-"}


def run_closed(cli, closing: str, *args, timeout: float = 300) -> int:
    """Runs the CLI with the descriptors of `closing` closed at its start; returns the exit status."""
    r = subprocess.run(["sh", "-c", f'exec "$@" {CLOSINGS[closing]}', "sh", str(cli), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    found = [m for m in SANITIZER_MARKS if m in r.stderr]
    assert not found, r.stderr[-4000:]
    return r.returncode


def files_in(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture()
def case(cli, tmp_path):
    r = run(cli, "make-checkpoint", "--out", tmp_path / "ck", *SIZES)
    assert r.returncode == 0, r.stderr
    ctx = tmp_path / "ctx.safetensors"
    r = run(cli, "make-context", "--checkpoint", tmp_path / "ck", "--out", ctx, "--rows", "16", "--history", "4")
    assert r.returncode == 0, r.stderr
    return dict(cli=cli, tmp=tmp_path, ck=tmp_path / "ck", ctx=ctx)


@pytest.mark.parametrize("closing", sorted(CLOSINGS))
def test_sample_with_closed_descriptors(case, closing):
    """sample --out --json --svg: each output is a normal run's (byte for byte but the JSON's timings), the
safetensors output loads."""
    t = case["tmp"]
    outs = {}
    for mode in ("normal", closing):
        d = t / mode
        d.mkdir()
        args = ["sample", "--checkpoint", case["ck"], "--context", case["ctx"], "--seed", "3", "--out",
                d / "r.st", "--json", d / "r.json", "--svg", d / "r.svg"]
        rc = run(case["cli"], *args).returncode if mode == "normal" else run_closed(case["cli"], closing, *args)
        assert rc == 0, f"{mode}: exit {rc}"
        outs[mode] = files_in(d)
    assert sorted(outs[closing]) == ["r.json", "r.st", "r.svg"]
    js = {m: json.loads(o.pop("r.json")) for m, o in outs.items()}
    for j in js.values():
        j.pop("step_seconds")  # timings
    assert js[closing] == js["normal"]
    assert outs[closing] == outs["normal"]
    assert set(load_file(t / closing / "r.st")) == set(load_file(t / "normal" / "r.st"))


@pytest.mark.parametrize("closing", ["all", "stdout+stderr"])
def test_make_checkpoint_and_context_with_closed_descriptors(case, closing):
    t = case["tmp"]
    assert run_closed(case["cli"], closing, "make-checkpoint", "--out", t / "ck2", *SIZES) == 0
    assert files_in(t / "ck2") == files_in(case["ck"])
    assert run_closed(case["cli"], closing, "make-context", "--checkpoint", t / "ck2", "--out", t / "ctx2.st",
                      "--rows", "16", "--history", "4") == 0
    assert (t / "ctx2.st").read_bytes() == case["ctx"].read_bytes()
    load_file(t / "ctx2.st")


@pytest.mark.parametrize("closing", ["all", "stdout+stderr"])
def test_failures_with_closed_descriptors_exit_nonzero_and_leave_nothing(case, closing):
    t = case["tmp"]
    out = t / "out"
    out.mkdir()
    # a missing context, and a context for another checkpoint (found after the outputs were reserved)
    assert run_closed(case["cli"], closing, "sample", "--checkpoint", case["ck"], "--context", t / "missing.st",
                      "--out", out / "r.st", "--json", out / "r.json") != 0
    other = t / "other"
    three = ["3" if a == "2" and SIZES[i - 1] == "--layers" else a for i, a in enumerate(SIZES)]
    assert run(case["cli"], "make-checkpoint", "--out", other, *three).returncode == 0
    assert run_closed(case["cli"], closing, "sample", "--checkpoint", other, "--context", case["ctx"],
                      "--out", out / "r.st", "--json", out / "r.json") != 0
    assert run_closed(case["cli"], closing, "make-context", "--checkpoint", t / "missing", "--out",
                      out / "c.st") != 0
    assert run_closed(case["cli"], closing, "make-checkpoint", "--out", out / "ck", "--layers", "0") != 0
    assert list(out.iterdir()) == []
    # an unknown option: the parser's error path, with nothing to print to
    assert run_closed(case["cli"], closing, "sample", "--no-such-option") != 0
    assert run_closed(case["cli"], closing, "inspect", case["ck"]) == 0


@pytest.mark.parametrize("closing", ["all", "stdout+stderr"])
def test_demo_with_closed_descriptors(cli, tmp_path, closing):
    """demo writes a checkpoint, a context and the results (safetensors, JSON, SVG): the same files as a normal run."""
    args = ["demo", "--size", "small", "--rows", "64", "--threads", "2"]
    assert run(cli, *args, "--out-dir", tmp_path / "normal").returncode == 0
    assert run_closed(cli, closing, *args, "--out-dir", tmp_path / "closed") == 0
    n, c = files_in(tmp_path / "normal"), files_in(tmp_path / "closed")
    assert sorted(c) == sorted(n) and "trajectories.safetensors" in c
    for name in ("trajectories.safetensors", "trajectories.svg"):
        assert c[name] == n[name], name
    load_file(tmp_path / "closed" / "trajectories.safetensors")
    ck = [p.name for p in (tmp_path / "normal").iterdir() if p.is_dir()]
    assert ck and all(files_in(tmp_path / "closed" / d) == files_in(tmp_path / "normal" / d) for d in ck)
    assert [p.name for p in (tmp_path / "closed").iterdir() if p.name.startswith(".")] == []
