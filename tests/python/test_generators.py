"""The generators (`make-checkpoint`, `make-context`) follow the output rules of `sample` (docs/SECURITY.md):
memory and disk are estimated before anything is written, with a message naming the command, the stage and
the sizes; every file appears together or none does, and a failed run (a full disk, a signal) leaves nothing,
not even the checkpoint directory it would have created."""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli import default_signals, run

SIZES = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--mlp", "128",
         "--ain-hidden", "32", "--waypoints", "8"]
# About 16 MiB of weights: past the file-size limit below.
MEDIUM = ["--layers", "2", "--hidden", "1024", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--mlp", "4096",
          "--ain-hidden", "32", "--waypoints", "8"]


def tree(d: Path) -> dict:
    return {p.relative_to(d): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def small_file_limit(kib: int = 256):
    """A child whose files may not grow past kib KiB: writes beyond fail with EFBIG, as on a full disk."""
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, resource.RLIM_INFINITY))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return pre


def run_limited(cli, *args, preexec=None, env=None, timeout=60):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec, env=None if env is None else {**os.environ, **env})


@pytest.fixture()
def ck(cli, tmp_path):
    r = run(cli, "make-checkpoint", "--out", tmp_path / "ck", *SIZES)
    assert r.returncode == 0, r.stderr
    return tmp_path / "ck"


@pytest.mark.parametrize("layout", [[], ["--shards", "3"]], ids=["single", "sharded"])
@pytest.mark.parametrize("target", ["ck-new", "a/b/ck-new"])
def test_checkpoint_full_disk_leaves_nothing(cli, tmp_path, layout, target):
    (tmp_path / "keep").write_text("x")
    before = tree(tmp_path)
    r = run_limited(cli, "make-checkpoint", "--out", tmp_path / target, *MEDIUM, *layout, preexec=small_file_limit())
    assert r.returncode == 1, r.stderr
    assert "write failed" in r.stderr and "File too large" in r.stderr and "no output was written" in r.stderr, r.stderr
    assert tree(tmp_path) == before  # no directory, no temporary file


def test_checkpoint_full_disk_keeps_an_existing_checkpoint(cli, tmp_path, ck):
    before = tree(tmp_path)
    r = run_limited(cli, "make-checkpoint", "--out", ck, *MEDIUM, "--seed", "7", preexec=small_file_limit())
    assert r.returncode == 1, r.stderr
    assert tree(tmp_path) == before  # the old files, unchanged; the existing directory stays


def test_context_full_disk_leaves_nothing(cli, tmp_path, ck):
    before = tree(tmp_path)
    r = run_limited(cli, "make-context", "--checkpoint", ck, "--out", tmp_path / "ctx.safetensors", "--rows", "20000",
                    preexec=small_file_limit())
    assert r.returncode == 1, r.stderr
    assert "ctx.safetensors: write failed" in r.stderr, r.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize("args,names", [
    (["--layers", "4096", "--hidden", "65536", "--mlp", "262144"],
     ["make-checkpoint", "--layers 4096", "--hidden 65536", "--mlp 262144", "largest tensor",
      "mlp.gate_proj.weight [262144, 65536]", "needs about 96.0 GiB", "available"]),
], ids=["huge-mlp"])
def test_checkpoint_enormous_sizes_named_at_once(cli, tmp_path, args, names):
    t0 = time.monotonic()
    # The address-space limit proves nothing is allocated: the estimate fails before any tensor exists.
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
    r = run_limited(cli, "make-checkpoint", "--out", tmp_path / "big", *args, preexec=pre)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 1, r.stderr
    for n in names:
        assert n in r.stderr, (n, r.stderr)
    assert "out of memory" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_memory_limit_named(cli, tmp_path):
    r = run_limited(cli, "make-checkpoint", "--out", tmp_path / "c", *MEDIUM, env={"ALPAMAYO_MEMORY_LIMIT": "1M"})
    assert r.returncode == 1, r.stderr
    for n in ("make-checkpoint", "--hidden 1024", "--mlp 4096", "needs about", "but only 1.00 MiB is available",
              "ALPAMAYO_MEMORY_LIMIT"):
        assert n in r.stderr, (n, r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_disk_estimate_named(cli, tmp_path):
    # Each tensor is small (384 MiB to generate), the whole file 1.7 TiB: refused before writing a byte.
    args = ["--layers", "4096", "--hidden", "4096", "--mlp", "16384"]
    if shutil.disk_usage(tmp_path).free > 1.6e12:
        pytest.skip("more than 1.6 TB free here")
    t0 = time.monotonic()
    r = run_limited(cli, "make-checkpoint", "--out", tmp_path / "c", *args)
    assert time.monotonic() - t0 < 20
    assert r.returncode == 1, r.stderr
    for n in ("make-checkpoint", "--layers 4096", "writing 2 files", "of disk", "model.safetensors", "is free in"):
        assert n in r.stderr, (n, r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_context_enormous_sizes_named_at_once(cli, tmp_path, ck):
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
    before = tree(tmp_path)
    t0 = time.monotonic()
    r = run_limited(cli, "make-context", "--checkpoint", ck, "--out", tmp_path / "ctx.safetensors", "--batch", "4096",
                    "--rows", "16777216", "--history", "100000", preexec=pre)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 1, r.stderr
    for n in ("make-context", "--batch 4096", "--rows 16777216", "--history 100000", "prompt cache tensor",
              "[4096, 2, 16777216, 16]", "needs about", "TiB", "available"):
        assert n in r.stderr, (n, r.stderr)
    assert tree(tmp_path) == before


def test_context_disk_estimate_named(cli, tmp_path, ck):
    if shutil.disk_usage(tmp_path).free > 1e12:
        pytest.skip("more than 1 TB free here")
    big = tmp_path / "bigck"
    # 4096 layers of [64, 2, 100000, 2, 16] bf16: 3.4 TB in all, 0.8 GB for the largest tensor (what memory must hold).
    r = run(cli, "make-checkpoint", "--out", big, "--layers", "4096", "--hidden", "64", "--heads", "4", "--kv-heads",
            "2", "--head-dim", "16", "--mlp", "64", "--ain-hidden", "32", "--waypoints", "8")
    assert r.returncode == 0, r.stderr
    before = tree(tmp_path)
    r = run(cli, "make-context", "--checkpoint", big, "--out", tmp_path / "ctx.safetensors", "--batch", "64",
            "--rows", "100000")
    assert r.returncode == 1, r.stderr
    for n in ("make-context", "--batch 64", "--rows 100000", "writing the context", "of disk", "is free in"):
        assert n in r.stderr, (n, r.stderr)
    assert tree(tmp_path) == before


def has_data(d: Path) -> bool:
    """Whether directory d holds a non-empty file (files may be renamed or removed while it looks)."""
    try:
        return d.is_dir() and any(f.is_file() and f.stat().st_size > 0 for f in d.iterdir())
    except FileNotFoundError:
        return False


def _writer_start() -> None:
    default_signals()
    os.nice(19)


def signal_mid_write(cmd: list, watch: Path, sig: int) -> None:
    """Runs cmd, sends sig once a non-empty file of its output appears in the directory watch, and checks that the
    process died of the signal and left nothing: watch empty, or gone where the command created it. The writer starts
    with the default signal dispositions (cli.default_signals) at the lowest priority, so that this poll sees its
    temporary files on a busy machine; a run that still finished first says nothing about a signal mid-write: it is
    repeated (its complete output removed), never counted as a pass."""
    existed = watch.exists()
    for _ in range(4):
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=_writer_start)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and p.poll() is None and not has_data(watch):
            time.sleep(0.005)
        p.send_signal(sig)
        p.wait(timeout=30)
        if p.returncode == 0:  # finished before the signal arrived: inconclusive
            if existed:
                for f in watch.iterdir():
                    f.unlink()
            else:
                shutil.rmtree(watch)
            continue
        assert p.returncode == -sig, p.stderr.read()
        assert not watch.exists() or list(watch.iterdir()) == []
        return
    pytest.fail(f"{cmd[1]} finished before the signal in every attempt")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_checkpoint_signal_leaves_nothing(cli, tmp_path, sig):
    signal_mid_write([cli, "make-checkpoint", "--out", tmp_path / "ck", "--layers", "16", "--hidden", "1024", "--mlp",
                      "8192", "--heads", "8", "--kv-heads", "4", "--head-dim", "64", "--shards", "2"],
                     tmp_path / "ck", sig)
    assert list(tmp_path.iterdir()) == []  # nor the directory it created


def test_context_signal_leaves_nothing(cli, tmp_path, ck):
    out = tmp_path / "out"
    out.mkdir()
    signal_mid_write([cli, "make-context", "--checkpoint", ck, "--out", out / "ctx.safetensors", "--rows", "2000000"],
                     out, signal.SIGINT)
