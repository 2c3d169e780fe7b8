"""Error metrics and the derived fp32 bounds (docs/ACCURACY.md explains them)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

U32 = 2.0 ** -24     # fp32 unit roundoff
U_BF16 = 2.0 ** -8   # bf16 unit roundoff
C_FP32 = 1.0         # the constant in the fp32 bound; measured ratios are <= 0.1 (ACCURACY.md)


def pcc(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    den = a.norm() * b.norm()
    return 1.0 if den == 0 else float((a @ b) / den)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def fp32_bound(scale: float, K: int, phase: float = 0.0, depth: int = 1) -> float:
    """c * u * scale * depth * (sqrt(K) + phase).

    sqrt(K): accumulation-order rounding of length-K dot products (probabilistic bound);
    phase: the largest angle fed to sin/cos (rope p*inv_freq, Fourier 2*pi*f*x), whose fp32 rounding
    is ~u*angle and shows up as an absolute error in the rotated values;
    depth: number of residual blocks whose errors add up (layer l -> l + 1).
    """
    return C_FP32 * U32 * max(scale, 1.0) * depth * (math.sqrt(K) + phase)


@dataclass
class Check:
    name: str
    pcc: float
    err: float
    bound: float
    min_pcc: float

    @property
    def ok(self) -> bool:
        return self.pcc >= self.min_pcc and self.err <= self.bound and math.isfinite(self.err)

    def __str__(self) -> str:
        ratio = self.err / self.bound if self.bound > 0 else float("inf")
        # 1 - PCC grows with the square of the relative error: the ratio of the square roots compares errors.
        pr = math.sqrt(max(1 - self.pcc, 0) / (1 - self.min_pcc)) if self.min_pcc < 1 else float(self.pcc < 1) * math.inf
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.name:28s} pcc {self.pcc:.9f} (>= {self.min_pcc:.9f}, "
                f"ratio {pr:.3f})  max|d| {self.err:.3e} <= {self.bound:.3e} (ratio {ratio:.3f})")


class Checks:
    """Collects every comparison of a test, so one failure still reports all the numbers."""

    def __init__(self):
        self.items: list[Check] = []
        self.notes: list[str] = []

    def add(self, name, got, ref, bound: float, min_pcc: float = 0.0) -> Check:
        if tuple(got.shape) != tuple(ref.shape):
            c = Check(f"{name} shape {tuple(got.shape)} != {tuple(ref.shape)}", 0.0, float("inf"), bound, min_pcc)
        else:
            c = Check(name, pcc(got, ref), max_abs(got, ref), bound, min_pcc)
        c.scale = float(ref.double().abs().max()) if ref.numel() else 0.0
        self.items.append(c)
        return c

    def note(self, s: str):
        self.notes.append(s)

    def report(self) -> str:
        return "\n".join([str(c) for c in self.items] + self.notes)

    def assert_ok(self):
        bad = [c for c in self.items if not c.ok]
        print(self.report())
        assert not bad, "failed checks:\n" + "\n".join(map(str, bad)) + "\n--- all:\n" + self.report()
