"""alpamayo_expert._atomic: the Python writers follow the C++ output module's rules (docs/SECURITY.md):
exclusive creation under an unpredictable name, no link followed, non-regular targets and inputs refused,
nothing left behind on failure."""
from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from alpamayo_expert import _atomic
from alpamayo_expert._atomic import check_target, save_safetensors_atomic, write_text_atomic


def files(d):
    return sorted(p.name for p in d.iterdir())


def test_writes_and_replaces_a_regular_file(tmp_path):
    p = tmp_path / "t.safetensors"
    save_safetensors_atomic({"a": torch.arange(4.0)}, p, metadata={"k": "v"})
    save_safetensors_atomic({"a": torch.ones(3)}, p)
    assert torch.equal(load_file(p)["a"], torch.ones(3))
    write_text_atomic(tmp_path / "c.json", "{}")
    assert (tmp_path / "c.json").read_text() == "{}"
    assert files(tmp_path) == ["c.json", "t.safetensors"]  # no temporary file left


def test_planted_link_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    names = iter(["AAAAAAAAAAAA", "BBBBBBBBBBBB"])
    monkeypatch.setattr(_atomic.secrets, "token_urlsafe", lambda n: next(names))
    (tmp_path / ".out.json.AAAAAAAAAAAA.tmp").symlink_to(victim)  # the attacker guessed the first name
    write_text_atomic(tmp_path / "out.json", "result")
    assert victim.read_bytes() == b"precious"
    assert (tmp_path / "out.json").read_text() == "result"
    assert os.path.islink(tmp_path / ".out.json.AAAAAAAAAAAA.tmp")  # left alone, not replaced


def test_temporary_names_are_unpredictable(tmp_path, monkeypatch):
    seen = []
    real = os.open

    def spy(name, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None:
            seen.append((name, flags))
        return real(name, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(_atomic.os, "open", spy)
    for _ in range(3):
        write_text_atomic(tmp_path / "x.txt", "x")
    assert len({n for n, _ in seen}) == 3
    for n, flags in seen:
        assert n.startswith(".x.txt.") and n.endswith(".tmp") and len(n) == len(".x.txt.") + 12 + 4
        assert flags & os.O_EXCL and flags & os.O_NOFOLLOW and flags & os.O_CREAT


def test_link_target_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "out.json").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        write_text_atomic(tmp_path / "out.json", "x")
    assert victim.read_bytes() == b"precious" and os.path.islink(tmp_path / "out.json")
    assert files(tmp_path) == ["out.json", "victim"]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_non_regular_target_is_refused(tmp_path, kind):
    t = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(t)
    else:
        t.mkdir()
    with pytest.raises(ValueError, match="named pipe" if kind == "fifo" else "directory"):
        save_safetensors_atomic({"a": torch.zeros(1)}, t)
    assert stat.S_ISFIFO(os.lstat(t).st_mode) if kind == "fifo" else t.is_dir()
    assert files(tmp_path) == ["target"]


def test_empty_and_directory_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="empty output path"):
        write_text_atomic("", "x")
    with pytest.raises(ValueError, match="names a directory"):
        write_text_atomic(str(tmp_path) + os.sep, "x")


def test_target_equal_to_an_input_is_refused(tmp_path):
    src = tmp_path / "in.safetensors"
    save_safetensors_atomic({"a": torch.zeros(2)}, src)
    before = src.read_bytes()
    os.link(src, tmp_path / "hard")
    for target, inp in [(src, src), (tmp_path / "hard", src), (tmp_path / "." / "in.safetensors", tmp_path / "hard")]:
        with pytest.raises(ValueError, match="is the input"):
            save_safetensors_atomic({"a": torch.ones(2)}, target, inputs=[inp])
    assert src.read_bytes() == before
    assert files(tmp_path) == ["hard", "in.safetensors"]


def test_failure_while_writing_leaves_nothing_and_keeps_the_old_file(tmp_path):
    p = tmp_path / "t.safetensors"
    save_safetensors_atomic({"a": torch.zeros(2)}, p)
    before = p.read_bytes()
    with pytest.raises(Exception):
        save_safetensors_atomic({"a": torch.zeros(2), "b": "not a tensor"}, p)  # type: ignore[dict-item]

    def boom(fd):
        os.write(fd, b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _atomic._write_exclusive(p, boom)
    assert p.read_bytes() == before
    assert files(tmp_path) == ["t.safetensors"]


def test_target_replaced_by_a_link_during_the_write_is_refused(tmp_path):
    p = tmp_path / "out.txt"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")

    def swap(fd):
        os.write(fd, b"data")
        p.symlink_to(victim)  # planted while the data was written

    with pytest.raises(ValueError, match="symbolic link"):
        _atomic._write_exclusive(p, swap)
    assert victim.read_bytes() == b"precious"
    assert files(tmp_path) == ["out.txt", "victim"]


def test_never_writes_through_a_closed_standard_descriptor(tmp_path):
    """A process started with stdin (or stdout, stderr) closed: the directory and the temporary file never take
    descriptor 0, 1 or 2 (what the process prints there would land in the file), and none is left open."""
    saved = os.dup(0)
    seen = {}

    def fill(fd):
        seen["fd"] = fd
        try:
            os.fstat(0)
            seen["zero"] = "open"
        except OSError:
            seen["zero"] = "closed"
        _atomic._write_all(fd, b"data")

    os.close(0)
    try:
        _atomic._write_exclusive(tmp_path / "t.txt", fill)
        try:
            os.fstat(0)
            after = "open"
        except OSError:
            after = "closed"
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert seen["fd"] >= 3 and seen["zero"] == "closed" and after == "closed"
    assert (tmp_path / "t.txt").read_bytes() == b"data"
