"""Hostile inputs and shared directories, end to end: outputs never destroy anything and appear all together
or not at all, inputs never block, shard paths stay in the checkpoint, files changed under a run give an error
(never a signal), interrupted runs leave nothing."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from cli import default_signals, run

SIZES = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--mlp", "128",
         "--ain-hidden", "32", "--waypoints", "8"]


@pytest.fixture()
def case(cli, tmp_path):
    """A tiny checkpoint (single file and sharded), a context, and an output directory."""
    for args in (["--out", tmp_path / "ck"], ["--out", tmp_path / "sharded", "--shards", "2"]):
        r = run(cli, "make-checkpoint", *args, *SIZES)
        assert r.returncode == 0, r.stderr
    ctx = tmp_path / "ctx.safetensors"
    r = run(cli, "make-context", "--checkpoint", tmp_path / "ck", "--out", ctx, "--rows", "2000", "--history", "4")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    out.mkdir()
    return dict(cli=cli, tmp=tmp_path, ck=tmp_path / "ck", sharded=tmp_path / "sharded", ctx=ctx, out=out)


def sample_args(c, *extra, ck=None, ctx=None, out=None, steps=2):
    return ["sample", "--checkpoint", ck or c["ck"], "--context", ctx or c["ctx"], "--out",
            out if out is not None else c["out"] / "r.safetensors", "--backend", "reference", "--steps", steps, *extra]


def snapshot(*dirs):
    """Every file under dirs with its bytes (links as their target name)."""
    s = {}
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.is_symlink():
                s[p] = ("link", os.readlink(p))
            elif p.is_file():
                s[p] = ("file", p.read_bytes())
    return s


def expect_clean_failure(c, args, *must_name, timeout=60):
    before = snapshot(c["tmp"])
    r = run(c["cli"], *args, timeout=timeout)
    cmd = " ".join(map(str, args))
    assert r.returncode == 1, f"expected exit 1, got {r.returncode} for: {cmd}\nstderr: {r.stderr}"
    for part in must_name:
        assert str(part) in r.stderr, f"stderr should name {part!r}; got:\n{r.stderr}\ncommand: {cmd}"
    assert snapshot(c["tmp"]) == before, f"files changed or left behind by: {cmd}"
    return r


# ---- class 1: outputs that destroy things
def test_planted_links_at_temporary_names_are_never_followed(case):
    c = case
    victim = c["tmp"] / "victim"
    victim.write_bytes(b"precious")
    try:
        last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    except OSError:
        last = os.getpid()
    names = ["r.safetensors", "r.json", "r.svg"]
    for pid in range(last - 20, last + 400):  # the old scheme: OUT.tmp.<pid>
        for n in names:
            (c["out"] / f"{n}.tmp.{pid}").symlink_to(victim)
    r = run(c["cli"], *sample_args(c, "--json", c["out"] / "r.json", "--svg", c["out"] / "r.svg"))
    assert r.returncode == 0, r.stderr
    assert victim.read_bytes() == b"precious"
    assert all((c["out"] / n).is_file() and not (c["out"] / n).is_symlink() for n in names)
    assert not [p for p in c["out"].iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_output_that_is_a_link_is_refused(case):
    c = case
    victim = c["tmp"] / "victim"
    victim.write_bytes(b"precious")
    (c["out"] / "r.json").symlink_to(victim)
    expect_clean_failure(c, sample_args(c, "--json", c["out"] / "r.json"), "--json", "symbolic link")


def test_output_equal_to_an_input_is_refused(case):
    c = case
    os.link(c["ctx"], c["tmp"] / "ctx-hardlink.safetensors")
    (c["tmp"] / "ctx-symlink.safetensors").symlink_to(c["ctx"])
    noise = c["tmp"] / "noise.safetensors"
    shutil.copy(c["ctx"], noise)
    for option, path, input_name in [
        ("--out", c["ctx"], "--context"),
        ("--out", c["tmp"] / "out" / ".." / "ctx.safetensors", "--context"),
        ("--out", c["tmp"] / "ctx-hardlink.safetensors", "--context"),
        ("--out", c["ck"] / "model.safetensors", "--checkpoint"),
        ("--json", c["ck"] / "config.json", "--checkpoint"),
        ("--layers-out", c["sharded"] / "model-00001-of-00003.safetensors", "--checkpoint"),
    ]:
        args = sample_args(c, ck=c["sharded"] if option == "--layers-out" else None)
        if option == "--out":
            args[args.index("--out") + 1] = path
        else:
            args += [option, path]
        expect_clean_failure(c, args, option, f"same file as {input_name}")
    # The noise file and a --vlm-config are inputs too.
    expect_clean_failure(c, sample_args(c, "--noise", noise, out=noise), "--out", "same file as --noise")
    expect_clean_failure(c, sample_args(c, "--vlm-config", c["ck"] / "config.json", "--json", c["ck"] / "config.json"),
                         "--json", "same file as")


def test_output_equal_to_another_output_is_refused(case):
    c = case
    x = c["out"] / "x"
    expect_clean_failure(c, sample_args(c, "--json", x, out=x), "--json", "same file as --out")
    expect_clean_failure(c, sample_args(c, "--json", x, "--svg", c["tmp"] / "out" / ".." / "out" / "x"),
                         "--svg", "same file as --json")


def _null_device(tmp: Path) -> Path:
    """A character device to write to. As root, a private copy of /dev/null (so that a broken build can
    never replace the real one); otherwise /dev/null itself, which only root could replace."""
    if os.geteuid() == 0:
        dev = tmp / "null"
        try:
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError:
            return None  # no CAP_MKNOD: skip rather than risk the real /dev/null
        return dev
    return Path("/dev/null")


def test_device_and_pipe_outputs_are_refused(case):
    c = case
    dev = _null_device(c["tmp"])
    if dev is not None:
        expect_clean_failure(c, sample_args(c, out=dev), f"--out {dev}", "character device")
        expect_clean_failure(c, sample_args(c, "--json", dev), f"--json {dev}", "character device")
        assert stat.S_ISCHR(os.stat(dev).st_mode)
    fifo = c["out"] / "fifo"
    os.mkfifo(fifo)
    expect_clean_failure(c, sample_args(c, "--svg", fifo), "--svg", "named pipe", timeout=30)
    expect_clean_failure(c, sample_args(c, out=""), "--out", "empty output path")
    expect_clean_failure(c, sample_args(c, out=c["out"]), "--out", "is a directory")


# ---- class 2: half-written result sets
def _unwritable_dir(tmp: Path) -> Path:
    if os.geteuid() == 0:
        return Path("/sys")  # not writable even for root
    d = tmp / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d


def test_unwritable_json_fails_before_any_work_and_leaves_no_out(case):
    c = case
    ro = _unwritable_dir(c["tmp"])
    r = expect_clean_failure(c, sample_args(c, "--json", ro / "r.json"), "--json", "cannot create a file in directory")
    assert "step" not in r.stderr and "sampling" not in r.stderr, "the computation ran before the output was checked"
    r = expect_clean_failure(c, sample_args(c, "--svg", c["tmp"] / "nope" / "r.svg"), "--svg", "does not exist")
    assert "step" not in r.stderr and "sampling" not in r.stderr


def _start(c, args):
    return subprocess.Popen([str(c["cli"]), *map(str, args)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, preexec_fn=default_signals)


def _wait_sampling(p):
    # The CLI says "sampling ..." once the model is loaded and the context bound, right before the Euler
    # steps (which run in one call); the step times follow at the end.
    line = p.stderr.readline()
    assert line.startswith("sampling"), f"unexpected stderr: {line}"


def test_output_that_cannot_be_committed_leaves_nothing(case):
    """--json turns into a directory during the run: neither --out nor --json appears, --out's old file stays."""
    c = case
    (c["out"] / "r.safetensors").write_bytes(b"old result")
    p = _start(c, sample_args(c, "--json", c["out"] / "r.json", steps=300))
    _wait_sampling(p)
    (c["out"] / "r.json").mkdir()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert "--json" in err and "no output was written" in err, err
    assert (c["out"] / "r.safetensors").read_bytes() == b"old result"
    assert sorted(x.name for x in c["out"].iterdir()) == ["r.json", "r.safetensors"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_leaves_nothing(case, sig):
    c = case
    p = _start(c, sample_args(c, "--json", c["out"] / "r.json", "--svg", c["out"] / "r.svg", steps=5000))
    _wait_sampling(p)
    assert len(list(c["out"].iterdir())) == 3  # the reserved temporaries
    p.send_signal(sig)
    p.communicate(timeout=60)
    assert p.returncode == -sig
    assert list(c["out"].iterdir()) == []


# ---- class 3: files changed under a mapped run
@pytest.mark.parametrize("which", ["context", "checkpoint"])
def test_file_truncated_under_a_run_is_an_error_not_a_signal(case, which):
    c = case
    victim = c["ctx"] if which == "context" else c["ck"] / "model.safetensors"
    p = _start(c, sample_args(c, "--json", c["out"] / "r.json", steps=1500))
    _wait_sampling(p)
    os.truncate(victim, 4096)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, f"exit {p.returncode}: {err}"
    assert victim.name in err and "while in use" in err, err
    assert list(c["out"].iterdir()) == []


# ---- class 4: escaping the checkpoint directory
@pytest.mark.parametrize("target", ["../outside.safetensors", "ABSOLUTE", "sub/../../outside.safetensors"])
def test_index_cannot_escape_the_checkpoint(case, target):
    c = case
    outside = c["tmp"] / "outside.safetensors"
    shutil.copy(c["sharded"] / "model-00001-of-00003.safetensors", outside)
    if target == "ABSOLUTE":
        target = str(outside)
    index = c["sharded"] / "model.safetensors.index.json"
    j = json.loads(index.read_text())
    key = next(k for k, v in j["weight_map"].items() if v == "model-00001-of-00003.safetensors")
    for k, v in j["weight_map"].items():
        if v == "model-00001-of-00003.safetensors":
            j["weight_map"][k] = target
    index.write_text(json.dumps(j))
    expect_clean_failure(c, sample_args(c, ck=c["sharded"]), "model.safetensors.index.json", target,
                         "inside the checkpoint directory")
    assert key  # the loader refused before opening anything outside


def test_shard_that_is_not_safetensors_is_named_as_such(case):
    c = case
    cfg = (c["ck"] / "config.json").read_bytes()
    (c["ck"] / "model.safetensors").write_bytes(cfg)
    r = expect_clean_failure(c, sample_args(c), "model.safetensors: not a safetensors file", "JSON text")
    assert str(struct.unpack("<Q", cfg[:8])[0]) not in r.stderr, "the first 8 bytes printed as a number"


# ---- class 5: inputs that block
@pytest.mark.parametrize("which", ["config.json", "shard", "context", "vlm-config", "noise"])
def test_named_pipe_input_fails_fast(case, which):
    c = case
    args = sample_args(c)
    if which == "config.json":
        (c["ck"] / "config.json").unlink()
        os.mkfifo(c["ck"] / "config.json")
        name = "config.json"
    elif which == "shard":
        (c["ck"] / "model.safetensors").unlink()
        os.mkfifo(c["ck"] / "model.safetensors")
        name = "model.safetensors"
    else:
        fifo = c["tmp"] / f"{which}.pipe"
        os.mkfifo(fifo)
        name = fifo.name
        if which == "context":
            args[args.index("--context") + 1] = fifo
        else:
            args += [f"--{which}", fifo]
    expect_clean_failure(c, args, name, "named pipe", timeout=30)


def test_directory_as_config_json_is_named_as_such(case):
    c = case
    (c["ck"] / "config.json").unlink()
    (c["ck"] / "config.json").mkdir()
    expect_clean_failure(c, sample_args(c), "config.json", "is a directory, expected a regular file")
