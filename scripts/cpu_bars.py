#!/usr/bin/env python3
"""The cpu backend against its bars on this machine, in one command (docs/PERFORMANCE.md, "Against the machine's
floor and PyTorch").

Runs, one process at a time, at the seed's full size unless --sizes says otherwise:
  1. bench/bench_vs_torch.py (ours with bf16 and int8 weights, PyTorch fp32 and bf16), unless --no-torch;
  2. --runs bench_step runs per weight format with the kernels chosen at load, each step against the roofline floor
     that run printed (its own measured peaks, AMX included, and streaming read bandwidth: per phase
     max(flop / peak, bytes / bandwidth)), and the weight bytes per second of its matmul phases against that
     bandwidth (the 80% bar);
  3. each weight matmul kernel forced in turn (ALPAMAYO_CPU_KERNELS=matmul_bf16=... / matmul_int8=...), and both
     weight formats with --kv int8; a kernel this CPU cannot run is listed with bench_step's reason;
  4. six samples sharing one prompt (`--B 6 --suffix 40`), bf16 and int8 weights, each against its own floor;
  5. the line Matmul.OnednnUsesAmxExactlyWhereUsable prints (which oneDNN implementation runs, AMX or not).
  6. bench/bench_amx_tiles where AMX is granted: what the AMX tile loop itself sustains on this machine, one thread
     (registers, L1, L2, beyond L2; fed by weights streamed from memory, against one core's read bandwidth), the
     ceilings the AMX bars meet here (docs/PERFORMANCE.md, "AMX, sixth pass"); --quick where --sizes is given.
Prints the CPU (lscpu), a table of each step against the floor of its own kernels' instructions and against the
roofline (every op on the CPU's fastest unit, what the bars are judged against), the matmul phases' GB/s beside
each, and ours against PyTorch's faster configuration, and writes everything as JSON (--out). The bars depend on
whether the OS grants AMX (bench_step's `isa:` line): one sample at most 1.5x its roofline, six sharing a prompt 2x,
3x faster than PyTorch with AMX; 1.25x, 1.5x and 2x without. Exit status 0 when every run ran; the bars
are reported, not enforced (a shared machine's noise moves the ratios by several percent).
With ALPAMAYO_CPU_ISA set (e.g. avx512_bf16 on an AMX machine), our kernels and the roofline both stay within the
cap, so the run is judged by the bars of a machine without what the cap removes; bench_vs_torch caps PyTorch's
oneDNN the same way (ONEDNN_MAX_CPU_ISA).

usage: python3 scripts/cpu_bars.py [--build build] [--threads 2] [--runs 3] [--no-torch] [--sizes "--L 4"]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STREAM_BAR = 0.80  # the matmul phases' weight bytes per second, as a share of the measured read bandwidth
# The bars per kind of machine: one sample's step against its roofline floor, six samples sharing one prompt against
# theirs, and ours against PyTorch's faster configuration. With AMX (granted by the OS: bench_step's `isa:` line)
# the floor is lower (tile arithmetic), and so are the step / floor bars' demands relative to it.
BARS = {True: {"floor": 1.5, "shared": 2.0, "torch": 3.0}, False: {"floor": 1.25, "shared": 1.5, "torch": 2.0}}
SHARED = ["--B", "6", "--suffix", "40"]  # the release's six trajectories per prompt, 40 own suffix rows each
CANDIDATES = {"matmul_bf16": ("bf16", ["amx_bf16", "avx512_bf16", "onednn", "avx512_fma", "avx2_fma"]),
              "matmul_int8": ("int8", ["avx512_vnni", "avx2_int8", "amx_int8", "onednn", "avx512_fma", "avx2_fma"])}


def lscpu() -> dict:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return {"error": str(e)}
    fields = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Model name", "CPU family", "Model", "CPU(s)", "Thread(s) per core"):
            fields[key.strip()] = value.strip()
    flags = next((l.split(":", 1)[1].split() for l in out.splitlines() if l.startswith("Flags")), [])
    fields["flags"] = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx_vnni", "fma", "avx2")))
    return fields


def last_json(text: str) -> dict:
    lines = [l for l in text.splitlines() if l.startswith("{")]
    if not lines:
        raise ValueError("no JSON result line in:\n" + text[-2000:])
    return json.loads(lines[-1])


def bench_step(exe: Path, args: list[str], env_kernels: str | None = None) -> dict:
    """One bench_step process: its JSON line, the ratio to its own floor, the kernel lines; or the error it printed."""
    env = dict(os.environ)
    env.pop("ALPAMAYO_CPU_KERNELS", None)
    if env_kernels:
        env["ALPAMAYO_CPU_KERNELS"] = env_kernels
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        why = (r.stderr.strip() or r.stdout.strip()).splitlines()
        return {"args": args, "kernels": env_kernels, "error": why[-1] if why else f"exit status {r.returncode}"}
    res = last_json(r.stdout)
    res["args"] = args
    res["kernels"] = env_kernels
    res["kernel_lines"] = [l[len("kernel "):] for l in r.stdout.splitlines() if l.startswith("kernel ")]
    # The usable sets only: under ALPAMAYO_CPU_ISA the line goes on with the capped-off ones in brackets.
    isa = next((l.split("[")[0].split()[1:] for l in r.stdout.splitlines() if l.startswith("isa:")), [])
    res["amx"] = "amx_bf16" in isa
    if res.get("floor_s"):
        res["ratio"] = res["step_s_mean"] / res["floor_s"]
    if res.get("floor_best_s"):  # the roofline: every op on the CPU's fastest unit (what the bars are against)
        res["ratio_roofline"] = res["step_s_mean"] / res["floor_best_s"]
    if res.get("matmul_gbs") and res.get("read_gbs"):
        res["matmul_of_read"] = res["matmul_gbs"] / res["read_gbs"]
    return res


def stream_text(res: dict) -> str:
    """The matmul phases' weight GB/s against the read bandwidth, as printed beside each run."""
    if not res.get("matmul_of_read"):
        return "matmul GB/s not measured"
    return (f"matmul {res['matmul_gbs']:.1f} GB/s = {100 * res['matmul_of_read']:.0f}% of {res['read_gbs']:.1f} GB/s "
            f"read")


def torch_run(python: str, exe: Path, threads: int, sizes: list[str]) -> dict:
    cmd = [python, str(ROOT / "bench" / "bench_vs_torch.py"), "--bench-step", str(exe), "--threads", str(threads),
           *sizes]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]}
    ours = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{"backend"')]
    torch = [json.loads(l.split(" (process")[0]) for l in r.stdout.splitlines() if l.startswith('{"torch"')]
    out = {"ours": ours, "torch": torch}
    if ours and torch:
        best = min(t["step_s_mean"] for t in torch)
        out["torch_best_s"] = best
        for o in ours:
            o["ratio"] = o["step_s_mean"] / o["floor_s"] if o.get("floor_s") else None
            o["faster_than_torch"] = best / o["step_s_mean"]
    return out


def amx_line(build: Path) -> str:
    exe = build / "alpamayo_tests"
    if not exe.is_file():
        return f"not run: {exe} not built"
    r = subprocess.run([str(exe), "--gtest_filter=Matmul.OnednnUsesAmxExactlyWhereUsable"], capture_output=True,
                       text=True)
    lines = [l for l in r.stdout.splitlines() if "measured" in l or "oneDNN" in l or "SKIPPED" in l or "FAILED" in l]
    status = "passed" if r.returncode == 0 else f"exit status {r.returncode}"
    return "; ".join(lines + [status])


TILE_ROW = re.compile(r"^\s*(.*?)\s+([0-9.]+) (TFLOP/s|GB/s)$")
TILE_SHARE = re.compile(r"best of the two, of the read bandwidth\s+([0-9.]+)%")


def amx_tiles(build: Path, quick: bool) -> dict:
    """bench_amx_tiles' figures by label ({label: [value, unit]}, "streamed_of_read" as a share), or why not run."""
    exe = build / "bench" / "bench_amx_tiles"
    if not exe.is_file():
        return {"not_run": f"{exe} not built"}
    r = subprocess.run([str(exe), *(["--quick"] if quick else [])], capture_output=True, text=True)
    if r.returncode != 0:
        return {"not_run": f"exit status {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"}
    if "is not usable here" in r.stdout:
        return {"not_run": r.stdout.strip().splitlines()[0]}
    out: dict = {"rows": {}}
    for line in r.stdout.splitlines():
        if m := TILE_ROW.match(line):
            out["rows"][m.group(1)] = [float(m.group(2)), m.group(3)]
        elif m := TILE_SHARE.search(line):
            out["streamed_of_read"] = float(m.group(1)) / 100
    return out


def tiles_text(t: dict) -> str:
    if "not_run" in t:
        return f"not run: {t['not_run']}"
    def value(key: str) -> float:
        return next((v for k, (v, _) in t["rows"].items() if key in k), float("nan"))
    text = f"registers {value('registers only'):.2f}, operands from L2 {value('256 KB (L2)'):.2f} TFLOP/s"
    if "streamed_of_read" in t:
        text += f"; weights streamed at 64 rows {100 * t['streamed_of_read']:.0f}% of one core's read bandwidth"
    return text + " (one thread)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=str(ROOT / "build"), help="the build directory (bench/bench_step in it)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3, help="bench_step runs per weight format with the chosen kernels")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-torch", action="store_true", help="skip bench_vs_torch (needs torch and transformers)")
    p.add_argument("--python", default=sys.executable, help="the Python with torch for bench_vs_torch")
    p.add_argument("--sizes", default="", help="extra size options for every run, e.g. \"--L 4\" (default: the "
                                               "seed's full size)")
    p.add_argument("--out", default="cpu-bars.json")
    a = p.parse_args()

    build = Path(a.build)
    exe = build / "bench" / "bench_step"
    if not exe.is_file():
        print(f"error: {exe} not found: build the benchmarks first (cmake --build {build} --target bench_step)",
              file=sys.stderr)
        return 2
    sizes = a.sizes.split()
    # --profile 1: the phase times give the matmul phases' GB/s (the tables go to stderr, not printed here).
    common = [*sizes, "--threads", str(a.threads), "--warmup", "1", "--profile", "1"]
    report: dict = {"cpu": lscpu(), "threads": a.threads, "sizes": sizes or "the seed's full size"}
    print(f"cpu: {report['cpu'].get('Model name', '?')} (family {report['cpu'].get('CPU family', '?')}, model "
          f"{report['cpu'].get('Model', '?')}), {report['cpu'].get('CPU(s)', '?')} CPUs; "
          f"{' '.join(report['cpu'].get('flags', []))}", flush=True)

    if not a.no_torch:
        print("bench_vs_torch ...", flush=True)
        report["vs_torch"] = torch_run(a.python, exe, a.threads, sizes)
    runs = []
    for i in range(a.runs):
        for w in ("int8", "bf16"):
            res = bench_step(exe, [*common, "--weights", w, "--steps", str(a.steps)])
            print(f"  run {i + 1} {w}: " + (f"{res['step_s_mean']:.4f} s / floor {res['floor_s']:.4f} s = "
                                             f"{res['ratio']:.3f}x; {stream_text(res)}" if "error" not in res
                                             else res["error"]), flush=True)
            runs.append(res)
    report["runs"] = runs
    forced = []
    for op, (w, names) in CANDIDATES.items():
        for name in names:
            res = bench_step(exe, [*common, "--weights", w, "--steps", "2"], f"{op}={name}")
            print(f"  {op}={name}: " + (f"{res['step_s_mean']:.4f} s, {res['ratio']:.3f}x its floor "
                                        f"{res['floor_s']:.4f} s; {stream_text(res)}"
                                        if "error" not in res else res["error"]), flush=True)
            forced.append(res)
    for w in ("bf16", "int8"):
        res = bench_step(exe, [*common, "--weights", w, "--kv", "int8", "--steps", "2"])
        print(f"  {w} weights, --kv int8: " + (f"{res['step_s_mean']:.4f} s, {res['ratio']:.3f}x its floor "
                                              f"{res['floor_s']:.4f} s; {stream_text(res)}"
                                              if "error" not in res else res["error"]), flush=True)
        forced.append(res)
    report["forced"] = forced
    shared = []
    for w in ("bf16", "int8"):
        res = bench_step(exe, [*common, *SHARED, "--weights", w, "--steps", "2"])
        print(f"  {w} weights, 6 samples sharing the prompt: " + (
            f"{res['step_s_mean']:.4f} s, {res['ratio']:.3f}x its floor {res['floor_s']:.4f} s; {stream_text(res)}"
            if "error" not in res else res["error"]), flush=True)
        shared.append(res)
    report["shared"] = shared
    report["amx"] = amx_line(build)
    amx = any(r.get("amx") for r in runs)
    # Under a cap (ALPAMAYO_CPU_ISA) the kernels and bars are a machine's without AMX: its tile loop is not measured.
    report["amx_tiles"] = (amx_tiles(build, quick=bool(sizes)) if amx else
                           {"not_run": "AMX is not usable in this run (bench_step's isa: line)"})
    bars = BARS[amx]
    report["bars"] = {"amx_granted": amx, **bars}

    # The summary.
    print(f"\n{report['cpu'].get('Model name', '?')}, {a.threads} threads, {' '.join(sizes) or 'full size'}")
    print(f"bars ({'AMX granted' if amx else 'no AMX'}): one sample {bars['floor']}x its floor, six sharing a prompt "
          f"{bars['shared']}x, {bars['torch']}x faster than PyTorch; matmul phases {100 * STREAM_BAR:.0f}% of read")
    print("| weights | samples | kernels | s/step (mean) | floor s | step / floor | roofline s | step / roofline | bar "
          "| matmul GB/s / read GB/s | bar 80% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for res in runs + forced + shared:
        samples = res["args"][res["args"].index("--B") + 1] if "--B" in res["args"] else "1"
        if "error" in res:
            print(f"| {res['args'][res['args'].index('--weights') + 1]} | {samples} | {res['kernels'] or 'chosen'} | "
                  f"- | - | {res['error'].split('. Candidates:')[0]} | - | - | - | - | - |")  # the full message is above
            continue
        w = res["weights"] + (", kv " + res["args"][res["args"].index("--kv") + 1] if "--kv" in res["args"] else "")
        kern = ", ".join(" ".join(l.split()[:2]) for l in res["kernel_lines"])
        mr = res.get("matmul_of_read")
        stream = (f"{res['matmul_gbs']:.1f} / {res['read_gbs']:.1f} = {100 * mr:.0f}% | "
                  f"{'met' if mr >= STREAM_BAR else 'missed'}") if mr and samples == "1" else "- | -"
        bar = bars["floor"] if samples == "1" else bars["shared"]
        roof = res.get("ratio_roofline", res["ratio"])
        print(f"| {w} | {samples} | {kern}{' (forced)' if res['kernels'] else ''} | {res['step_s_mean']:.4f} | "
              f"{res['floor_s']:.4f} | {res['ratio']:.3f}x | {res.get('floor_best_s', res['floor_s']):.4f} | "
              f"{roof:.3f}x | {bar}x {'met' if roof <= bar else 'missed'} | {stream} |")
    vt = report.get("vs_torch")
    if vt:
        if "error" in vt:
            print(f"bench_vs_torch: {vt['error']}")
        else:
            print(f"torch faster configuration: {vt['torch_best_s']:.3f} s/step")
            for o in vt["ours"]:
                print(f"  ours {o['weights']}: {o['step_s_mean']:.3f} s, {o['ratio']:.3f}x its floor, "
                      f"{o['faster_than_torch']:.2f}x faster than torch (bar {bars['torch']:.0f}x: "
                      f"{'met' if o['faster_than_torch'] >= bars['torch'] else 'missed'})")
    print(f"AMX (oneDNN): {report['amx']}")
    print(f"AMX tile loop (bench_amx_tiles): {tiles_text(report['amx_tiles'])}")
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {a.out}")
    failed = [r for r in runs + shared if "error" in r] + ([vt] if vt and "error" in vt else [])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
