"""scripts/cpu_bars.py, the one command that measures the cpu backend against its bars on a machine, run at a
tiny size: every run it makes either gives a step and the floor of its own measured peaks or names why it could not
run, and the JSON it writes holds the CPU and every result."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import compiled_backends

ROOT = Path(__file__).resolve().parents[2]
TINY_STEP = ["--L", "1", "--S", "40", "--Smax", "64", "--T", "16", "--steps", "1"]


@pytest.fixture
def bench_step(cli, monkeypatch) -> Path:
    """This build's bench_step, with the cpu backend; the session's kernel pin left out (the scripts' own choices)."""
    monkeypatch.delenv("ALPAMAYO_CPU_KERNELS", raising=False)
    if not any(name == "cpu" and not why for name, _, why in compiled_backends()):
        pytest.skip("this build has no cpu backend")
    exe = Path(cli).parent / "bench" / "bench_step"
    if not exe.is_file():
        pytest.skip(f"{exe} not built (ALPAMAYO_BUILD_BENCH=OFF)")
    return exe


def load_script(path: Path):
    """A script of the repository (scripts/cpu_bars.py, bench/bench_vs_torch.py) as a module, to call its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_bars_runs_every_configuration(bench_step, tmp_path):
    build = bench_step.parent.parent
    out = tmp_path / "bars.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_bars.py"), "--build", str(build), "--no-torch",
                        "--runs", "1", "--steps", "1", "--sizes", "--L 1 --S 40 --Smax 64 --T 16", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["cpu"].get("Model name"), rep["cpu"]
    # The chosen kernels: one run per weight format, each against its own floor.
    assert sorted(x["weights"] for x in rep["runs"]) == ["bf16", "int8"], rep["runs"]
    for x in rep["runs"]:
        assert x["step_s_mean"] > 0 and x["floor_s"] > 0
        assert x["ratio"] == pytest.approx(x["step_s_mean"] / x["floor_s"])
        # The roofline's other side: the read bandwidth, and the matmul phases' weight bytes per second against it.
        assert x["read_gbs"] > 0 and x["matmul_gbs"] > 0 and 0 < x["floor_best_s"] <= x["floor_s"] * (1 + 1e-6)
        assert x["matmul_of_read"] == pytest.approx(x["matmul_gbs"] / x["read_gbs"])
        assert any(l.startswith("attention") for l in x["kernel_lines"]), x
    # Every matmul candidate forced in turn, and --kv int8: a result with the forced kernel in use, or the reason.
    forced = {x["kernels"]: x for x in rep["forced"] if x["kernels"]}
    assert {k.split("=")[1] for k in forced if k.startswith("matmul_bf16")} == {"amx_bf16", "avx512_bf16", "onednn",
                                                                                 "avx512_fma", "avx2_fma"}
    assert {k.split("=")[1] for k in forced if k.startswith("matmul_int8")} == {"avx512_vnni", "avx2_int8", "amx_int8",
                                                                                 "onednn", "avx512_fma", "avx2_fma"}
    for k, x in forced.items():
        op, name = k.split("=")
        if "error" in x:
            assert name in x["error"] or "cannot" in x["error"] or "needs" in x["error"], x
        else:
            assert any(l.split()[:2] == [op, name] for l in x["kernel_lines"]), x
    assert any(x["kernels"] is None and "--kv" in x["args"] for x in rep["forced"])
    # Six samples sharing one prompt, both weight formats, against their own floors and the machine's bars.
    assert sorted(x["weights"] for x in rep["shared"]) == ["bf16", "int8"], rep["shared"]
    for x in rep["shared"]:
        assert "--B" in x["args"] and x["step_s_mean"] > 0 and x["ratio"] == pytest.approx(x["step_s_mean"] / x["floor_s"])
        assert x["ratio_roofline"] == pytest.approx(x["step_s_mean"] / x["floor_best_s"])
    amx = rep["bars"]["amx_granted"]
    assert rep["bars"]["floor"] == (1.5 if amx else 1.25) and rep["bars"]["shared"] == (2.0 if amx else 1.5)
    assert amx == any(x["amx"] for x in rep["runs"]) and (not amx or "amx_bf16" in Path("/proc/cpuinfo").read_text())
    assert "| weights | samples | kernels |" in r.stdout and "| step / roofline | bar |" in r.stdout and "AMX (oneDNN):" in r.stdout
    assert "| matmul GB/s / read GB/s | bar 80% |" in r.stdout and "% of " in r.stdout
    # The AMX tile loop's own ceilings where AMX is granted (bench_amx_tiles), else the reason it did not run.
    tiles = rep["amx_tiles"]
    if amx:
        assert "not_run" not in tiles, tiles
        assert tiles["rows"]["2 x 2, A and B each from 256 KB (L2)"][0] > 0, tiles
        assert all(v > 0 and unit in ("TFLOP/s", "GB/s") for v, unit in tiles["rows"].values()), tiles
        assert "operands from L2" in r.stdout
    else:
        assert "not usable" in tiles["not_run"] or "not built" in tiles["not_run"], tiles
    assert "AMX tile loop (bench_amx_tiles): " in r.stdout


def test_capped_run_is_judged_without_what_the_cap_removes(bench_step, monkeypatch):
    """Under ALPAMAYO_CPU_ISA=avx2 (every x86-64 machine this engine runs on has it) the kernels stay within AVX2 and so
    does the roofline: every op's fastest unit is then the one its kernel uses, so the two floors agree, and the
    script does not take the capped-off AMX (listed in the `isa:` line's brackets) as granted."""
    cpu_bars = load_script(ROOT / "scripts" / "cpu_bars.py")
    monkeypatch.setenv("ALPAMAYO_CPU_ISA", "avx2")
    x = cpu_bars.bench_step(bench_step, [*TINY_STEP, "--warmup", "0", "--weights", "bf16"])
    assert "error" not in x, x
    assert x["amx"] is False, x
    assert not any(w in l.split()[1] for l in x["kernel_lines"] for w in ("avx512", "amx")), x["kernel_lines"]
    assert x["floor_best_s"] == pytest.approx(x["floor_s"], rel=1e-3), x


def test_torch_is_capped_as_our_kernels_are(bench_step, monkeypatch):
    """bench_vs_torch gives PyTorch's oneDNN the cap ALPAMAYO_CPU_ISA gives our kernels: every cap the engine accepts
    (its own error lists them) maps to a oneDNN one, except those that cap nothing; a oneDNN cap the caller set wins."""
    monkeypatch.setenv("ALPAMAYO_CPU_ISA", "not-a-cap")
    r = subprocess.run([str(bench_step), *TINY_STEP], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "use one of:" in r.stderr, r.stderr
    caps = [c.strip() for c in r.stderr.split("use one of:")[1].strip().splitlines()[0].split(",")]
    bench_vs_torch = load_script(ROOT / "bench" / "bench_vs_torch.py")
    assert set(bench_vs_torch.ONEDNN_ISA) == set(caps) - {"amx", "all"}, caps
    assert bench_vs_torch.torch_env({"ALPAMAYO_CPU_ISA": "avx512_bf16"})["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    assert "ONEDNN_MAX_CPU_ISA" not in bench_vs_torch.torch_env({"ALPAMAYO_CPU_ISA": "amx"})
    assert "ONEDNN_MAX_CPU_ISA" not in bench_vs_torch.torch_env({})
    given = {"ALPAMAYO_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    assert bench_vs_torch.torch_env(given)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"


def test_amx_tile_ceilings_are_figures_or_the_reason(bench_step):
    """bench_amx_tiles read by cpu_bars: every figure a positive rate with its unit where AMX is granted, else the
    tool's own line saying why nothing ran; the summary line says either."""
    cpu_bars = load_script(ROOT / "scripts" / "cpu_bars.py")
    t = cpu_bars.amx_tiles(bench_step.parent.parent, quick=True)
    if "not_run" in t:
        assert "not usable" in t["not_run"] or "not built" in t["not_run"], t
        assert cpu_bars.tiles_text(t).startswith("not run: ")
    else:
        assert len(t["rows"]) >= 8 and all(v > 0 and u in ("TFLOP/s", "GB/s") for v, u in t["rows"].values()), t
        assert "registers " in cpu_bars.tiles_text(t) and "nan" not in cpu_bars.tiles_text(t)
    assert cpu_bars.tiles_text({"not_run": "AMX is not usable in this run"}) == "not run: AMX is not usable in this run"
