"""Fault injection into the output path (tests/fault/fault_inject.c, preloaded into the Release CLI): every
open, write, fsync, close and rename of the outputs' files fails in turn (EIO, ENOSPC) or, for write, comes back
short. Each failure must leave exactly the previous state (no output, no temporary file, no directory created,
earlier outputs and inputs untouched) and an error naming the file and the call; a short write must be resumed
and give the same files as a clean run. The matrix is in docs/SECURITY.md (Outputs: fault injection)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cli import cli_path, run

SIZES = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--mlp", "128",
         "--ain-hidden", "32", "--waypoints", "8"]
CALLS = ("open", "write", "fsync", "close", "rename", "ftruncate", "mmap")
KINDS = ("eio", "enospc", "short")
MESSAGE = {"eio": "Input/output error", "enospc": "No space left on device"}
# Injection points per call kind and failure kind, evenly spread over the calls a run makes (0: every call;
# the whole matrix takes about 10 s on a 2-core machine).
PER_CALL = int(os.environ.get("ALPAMAYO_FAULT_POINTS", "0"))


def shim() -> Path | None:
    p = Path(os.environ.get("ALPAMAYO_FAULT_LIB", str(cli_path().parent / "libalpamayo_fault_inject.so")))
    return p if p.is_file() else None


def sanitized(cli) -> bool:
    r = subprocess.run(["ldd", str(cli)], capture_output=True, text=True)
    return any(s in r.stdout for s in ("libasan", "libtsan", "libubsan"))


@pytest.fixture(scope="module")
def fault_lib(cli):
    lib = shim()
    if lib is None:
        pytest.fail("libalpamayo_fault_inject.so not found next to the CLI (build the tests, or set ALPAMAYO_FAULT_LIB)",
                    pytrace=False)
    if sanitized(cli):
        pytest.skip("the fault shim runs against the Release CLI only (sanitizer runtimes and LD_PRELOAD do not mix)")
    return lib


def snapshot(d: Path) -> dict:
    return {p.relative_to(d): (p.read_bytes() if p.is_file() else "dir") for p in sorted(d.rglob("*"))}


def timeless(state: dict) -> dict:
    """state with the timings of JSON outputs dropped (they differ from run to run)."""
    def drop(v):
        if isinstance(v, dict):
            return {k: drop(x) for k, x in v.items() if "seconds" not in k}
        return [drop(x) for x in v] if isinstance(v, list) else v
    return {k: drop(json.loads(v)) if k.suffix == ".json" and v != "dir" else v for k, v in state.items()}


def restore(d: Path, state: dict):
    """Puts d back to state (after a run that succeeded)."""
    for p in sorted(d.rglob("*"), reverse=True):
        if p.relative_to(d) not in state:
            p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
    for rel, v in state.items():
        if v == "dir":
            (d / rel).mkdir(exist_ok=True)
        elif (d / rel).read_bytes() != v:
            (d / rel).write_bytes(v)


def spread(n: int, k: int = PER_CALL) -> list[int]:
    if k <= 0 or n <= k:
        return list(range(1, n + 1))
    return sorted({1 + round(i * (n - 1) / (k - 1)) for i in range(k)})


class Scenario:
    def __init__(self, name, root: Path, fault_dir: Path, args: list, outputs: list[Path]):
        self.name, self.root, self.fault_dir, self.args, self.outputs = name, root, fault_dir, args, outputs

    def env(self, lib, **kv):
        return {"LD_PRELOAD": str(lib), "ALPAMAYO_FAULT_DIR": str(self.fault_dir.resolve()), **kv}


@pytest.fixture(scope="module")
def scenarios(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    inp = root / "in"
    inp.mkdir()
    assert run(cli, "make-checkpoint", "--out", inp / "ck", *SIZES).returncode == 0
    ctx = inp / "ctx.safetensors"
    assert run(cli, "make-context", "--checkpoint", inp / "ck", "--out", ctx, "--rows", "64", "--history", "4").returncode == 0
    out = root / "out"
    out.mkdir()
    names = ["r.safetensors", "r.json", "r.svg", "layers.safetensors"]
    sample = ["sample", "--checkpoint", inp / "ck", "--context", ctx, "--backend", "reference", "--steps", "2",
              "--seed", "3", "--out", out / names[0], "--json", out / names[1], "--svg", out / names[2],
              "--layers-out", out / names[3]]
    # Earlier outputs at the same paths (another seed): a failed run must keep them as they are.
    prev = [a if a != "3" else "4" for a in sample]
    assert run(cli, *prev).returncode == 0
    gen = root / "gen"
    gen.mkdir()
    return [
        Scenario("sample", root, out, sample, [out / n for n in names]),
        Scenario("make-checkpoint", root, gen, ["make-checkpoint", "--out", gen / "ck", *SIZES], [gen / "ck"]),
        Scenario("make-checkpoint-sharded", root, gen, ["make-checkpoint", "--out", gen / "ck", "--shards", "2", *SIZES],
                 [gen / "ck"]),
        Scenario("make-context", root, gen, ["make-context", "--checkpoint", inp / "ck", "--out", gen / "ctx.safetensors",
                                             "--rows", "64", "--history", "4"], [gen / "ctx.safetensors"]),
    ]


def run_case(cli, lib, sc: Scenario, results: dict, counts: dict):
    state = snapshot(sc.root)
    count_file = sc.root / f"count-{sc.name}.txt"
    r = run(cli, *sc.args, env=sc.env(lib, ALPAMAYO_FAULT_COUNT=str(count_file)), timeout=60)
    assert r.returncode == 0, r.stderr
    n = {k: int(v) for k, v in (line.split() for line in count_file.read_text().splitlines())}
    count_file.unlink()
    counts[sc.name] = n
    clean = snapshot(sc.root)
    restore(sc.root, state)
    assert snapshot(sc.root) == state
    for call in CALLS:
        for kind in KINDS:
            if kind == "short" and call != "write":
                continue
            points = spread(n.get(call, 0))
            ok = 0
            for at in points:
                r = run(cli, *sc.args, env=sc.env(lib, ALPAMAYO_FAULT_CALL=call, ALPAMAYO_FAULT_AT=str(at),
                                                  ALPAMAYO_FAULT_KIND=kind), timeout=60)
                where = f"{sc.name}: {call} #{at}/{n[call]} {kind}"
                if kind == "short":
                    assert r.returncode == 0, f"{where}: a short write must be resumed\n{r.stderr}"
                    assert timeless(snapshot(sc.root)) == timeless(clean), f"{where}: the files differ from a clean run's"
                    restore(sc.root, state)
                else:
                    assert r.returncode == 1, f"{where}: exit {r.returncode}\n{r.stderr}"
                    after = snapshot(sc.root)
                    assert after == state, (f"{where}: the state changed: added {sorted(set(after) - set(state))}, "
                                            f"removed {sorted(set(state) - set(after))}\n{r.stderr}")
                    assert MESSAGE[kind] in r.stderr, f"{where}: {r.stderr}"
                    assert any(f"{o}/" in r.stderr or f"{o}:" in r.stderr for o in sc.outputs), \
                        f"{where}: the message names no output\n{r.stderr}"
                    named = {"open": "open", "write": "write failed", "fsync": "fsync", "close": "close",
                             "rename": "rename"}[call]
                    assert named in r.stderr, f"{where}: the message does not name {call}\n{r.stderr}"
                ok += 1
            results[(sc.name, call, kind)] = (ok, len(points), n.get(call, 0))


def test_fault_matrix(cli, fault_lib, scenarios, request):
    results, counts = {}, {}
    for sc in scenarios:
        run_case(cli, fault_lib, sc, results, counts)
    # What ran, for docs/SECURITY.md (pytest -s prints it).
    lines = ["| run | " + " | ".join(CALLS) + " |", "| --- |" + " --- |" * len(CALLS)]
    for sc in scenarios:
        cells = []
        for call in CALLS:
            c = counts[sc.name].get(call, 0)
            if c == 0:
                cells.append("0 calls")
                continue
            got = [f"{k} {results[(sc.name, call, k)][0]}/{results[(sc.name, call, k)][1]}" for k in KINDS
                   if (sc.name, call, k) in results]
            cells.append(f"{c} calls: " + ", ".join(got))
        lines.append(f"| {sc.name} | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(lines))
    # Every output path makes each of these calls at least once: the matrix is not empty by accident.
    for sc in scenarios:
        for call in ("open", "write", "fsync", "close", "rename"):
            assert counts[sc.name][call] > 0, (sc.name, call, counts[sc.name])
