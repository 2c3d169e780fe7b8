"""Error classes: one subclass of alpamayo_expert.Error per kind of failure (the C API's statuses), each also the
builtin exception a Python caller expects, raised by the engine for real inputs."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import alpamayo_expert as ae
from alpamayo_expert import errors
from synth import TINY, CtxSpec, make_checkpoint, make_context

ROOT = Path(__file__).resolve().parents[2]

# Each class, the builtins it must also be and its code.
EXPECTED = {
    ae.InvalidArgumentError: ((ValueError,), "invalid_argument"),
    ae.FormatError: ((ValueError,), "format_error"),
    ae.FileIOError: ((OSError,), "io_error"),
    ae.UnsupportedError: ((NotImplementedError,), "unsupported"),
    ae.OutOfMemoryError: ((MemoryError,), "out_of_memory"),
    ae.NonFiniteError: ((FloatingPointError, ValueError), "non_finite"),
    ae.InvalidStateError: ((RuntimeError,), "invalid_state"),
    ae.InternalError: ((RuntimeError,), "internal"),
}


def test_one_class_per_code_each_the_builtin_expected():
    assert issubclass(ae.Error, RuntimeError) and ae.Error.code is None
    assert set(errors.ERRORS) == set(EXPECTED) and len(errors.ERRORS) == len(EXPECTED)
    for cls, (builtins, code) in EXPECTED.items():
        assert issubclass(cls, ae.Error), cls
        for b in builtins:
            assert issubclass(cls, b), (cls, b)
        e = cls("a message")
        assert e.code == code and str(e) == "a message"
    with pytest.raises(OSError):  # `except OSError` catches an engine I/O failure
        raise ae.FileIOError("x: cannot open")


def test_codes_are_the_c_api_statuses_and_the_cpp_codes():
    """The codes are the C API's status names, and ERRORS follows alpamayo::ErrorCode's order (the native
    module indexes it by code)."""
    header = (ROOT / "include/alpamayo/alpamayo.h").read_text()
    enum = re.search(r"typedef enum alpamayo_status \{(.*?)\} alpamayo_status;", header, re.S).group(1)
    statuses = {n.lower() for n in re.findall(r"ALPAMAYO_(\w+) = \d+", enum)} - {"ok"}
    assert statuses == {c.code for c in errors.ERRORS}
    cpp = (ROOT / "include/alpamayo/error.h").read_text()
    names = re.findall(r"^  (\w+),", re.search(r"enum class ErrorCode \{(.*?)\};", cpp, re.S).group(1), re.M)
    assert [n.lower() for n in names] == [c.__name__.removesuffix("Error").lower().replace("fileio", "io")
                                          for c in errors.ERRORS]


def test_the_native_module_raises_these_classes():
    from alpamayo_expert import _core
    assert _core.Error is ae.Error
    for cls in errors.ERRORS:
        assert getattr(_core, cls.__name__) is cls


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("errors")
    ck = make_checkpoint(d / "ck", TINY, "r1", "f32")
    ctx = make_context(d / "ctx.safetensors", TINY, CtxSpec(motion="v0"))
    return dict(dir=d, ck=ck, ctx=ctx)


def raised(fn, cls, match):
    with pytest.raises(cls, match=match) as e:
        fn()
    assert type(e.value) is cls and e.value.code == EXPECTED[cls][1]
    return e.value


def test_each_kind_raised_by_the_engine(files, tmp_path, monkeypatch):
    e = raised(lambda: ae.Model(str(tmp_path / "nope")), ae.FileIOError, "checkpoint directory not found")
    assert isinstance(e, OSError) and isinstance(e, ae.Error)
    raised(lambda: ae.Context.open(str(tmp_path / "none.safetensors")), ae.FileIOError, "cannot open")

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    raised(lambda: ae.Model(str(bad)), ae.FormatError, "invalid JSON")
    (tmp_path / "bad.safetensors").write_bytes(b"this is not a safetensors file")
    raised(lambda: ae.Context.open(str(tmp_path / "bad.safetensors")), ae.FormatError, "not a safetensors file")

    raised(lambda: ae.Model(str(files["ck"]), backend="gpu9"), ae.UnsupportedError, "unknown backend 'gpu9'")
    heun = tmp_path / "heun"
    make_checkpoint(heun, TINY, "r1", "f32")
    cfg = json.loads((heun / "config.json").read_text())
    cfg["diffusion_cfg"]["int_method"] = "heun"
    (heun / "config.json").write_text(json.dumps(cfg))
    raised(lambda: ae.Model(str(heun)), ae.UnsupportedError, "integrate with euler only")

    with monkeypatch.context() as mp:
        mp.setenv("ALPAMAYO_MEMORY_LIMIT", "1K")
        e = raised(lambda: ae.Model(str(files["ck"]), backend="reference"), ae.OutOfMemoryError,
                   "only 1.00 KiB is available")
        assert isinstance(e, MemoryError)

    m = ae.Model(str(files["ck"]), backend="reference")
    s = m.session()
    raised(s.sample, ae.InvalidStateError, "no context bound")
    ctx = ae.Context.open(str(files["ctx"]))
    s.bind(ctx)
    noise = np.zeros((3, TINY.T, 2), np.float32)
    noise[1, 2, 0] = np.nan
    e = raised(lambda: s.sample(noise=noise, steps=1), ae.NonFiniteError, "noise: non-finite value nan")
    assert isinstance(e, FloatingPointError) and isinstance(e, ValueError)
    raised(lambda: s.sample(steps=1, v0=float("nan")), ae.InvalidArgumentError, "v0 must be finite")
    f = ae.read_context(files["ctx"])
    raised(lambda: ae.Context(f.keys, f.values, f.valid_len, f.rope_delta, prompt_index=[0, 7, 0], v0=f.v0),
           ae.InvalidArgumentError, r"prompt_index\[1\] = 7 names no prompt")
    keys = [k.clone() for k in f.keys]
    keys[1][0, 0, 0, 3] = float("inf")
    raised(lambda: ae.Context(keys, f.values, f.valid_len, f.rope_delta, v0=f.v0), ae.NonFiniteError,
           r"key\.1: non-finite value at \[0, 0, 0, 3\]")
