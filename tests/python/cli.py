"""Run the alpamayo-expert CLI and read its outputs."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

DEFAULT_CLI = Path(__file__).resolve().parents[2] / "build" / "alpamayo-expert"


def cli_path() -> Path:
    return Path(os.environ.get("ALPAMAYO_CLI", str(DEFAULT_CLI)))


# What a sanitizer build of the CLI prints on a finding (scripts/test.sh runs the CLI tests on one): a test
# that expects a clean error must not pass on a sanitizer's abort.
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer")


def default_signals() -> None:
    """preexec_fn for a CLI that a test signals: a test run started with SIGINT or SIGHUP ignored (nohup, a
    script's background job) would pass that on, and the CLI, like a shell, leaves an inherited ignored signal
    ignored. The CLI under test starts with the default dispositions."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def run(cli, *args, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env})
    found = [m for m in SANITIZER_MARKS if m in r.stderr]
    assert not found, f"sanitizer finding in `{cli} {' '.join(map(str, args))}`:\n{r.stderr[-4000:]}"
    return r


@dataclass(frozen=True)
class Backend:
    name: str                   # a backend of `alpamayo-expert backends`
    weights: str | None = None  # its weight format; None: the backend's default
    kernel: str | None = None   # cpu backend: one op's kernel forced, "op=kernel" (the other ops as pinned)

    @property
    def id(self) -> str:
        return self.name + (f"-{self.weights}" if self.weights else "") + (f"-{self.kernel}" if self.kernel else "")

    def kernels(self) -> str:
        """The ALPAMAYO_CPU_KERNELS value (or a Model's `kernels`) of this backend: the session's pin
        (conftest.py) with this backend's forced op replaced; "" when nothing is forced or pinned."""
        ops = dict(kv.split("=", 1) for kv in os.environ.get("ALPAMAYO_CPU_KERNELS", "").split(",") if "=" in kv)
        if self.kernel:
            op, k = self.kernel.split("=", 1)
            ops[op] = k
        return ",".join(f"{op}={k}" for op, k in ops.items())

    def env(self) -> dict | None:
        return {"ALPAMAYO_CPU_KERNELS": self.kernels()} if self.kernel else None

    def args(self) -> list[str]:
        a = ["--backend", self.name]
        if self.weights:
            a += ["--weights", self.weights]
        if self.name == "cpu":
            a += ["--threads", os.environ.get("ALPAMAYO_TEST_THREADS", "2")]
        return a


REFERENCE = Backend("reference")


class CliError(AssertionError):
    pass


def sample(cli, checkpoint, context, out_dir, *, backend: Backend = REFERENCE, noise=None, seed=None,
           steps=None, all_steps=True, layers=True, extra=(), timeout: float = 600) -> dict[str, torch.Tensor]:
    """Run `sample`; returns the output tensors, plus `layers` (dict) when layers=True."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"out-{backend.id}.safetensors"
    args = ["sample", "--checkpoint", checkpoint, "--context", context, "--out", out, *backend.args()]
    if noise is not None:
        args += ["--noise", noise]
    if seed is not None:
        args += ["--seed", seed]
    if steps is not None:
        args += ["--steps", steps]
    if all_steps:
        args.append("--all-steps")
    lay = out_dir / f"layers-{backend.id}.safetensors"
    if layers:
        args += ["--layers-out", lay]
    args += list(extra)
    r = run(cli, *args, timeout=timeout, env=backend.env())
    if r.returncode != 0:
        raise CliError(f"{cli} {' '.join(map(str, args))}\nexit {r.returncode}\nstderr:\n{r.stderr}\nstdout:\n{r.stdout}")
    res = dict(load_file(str(out)))
    if layers:
        res["layers"] = dict(load_file(str(lay)))
    return res
