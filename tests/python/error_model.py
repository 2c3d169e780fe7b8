"""The error model behind every accuracy bound of the bf16 / int8 / block-format backends (docs/ACCURACY.md,
"The error model"). tests/cpp/error_model.h is the same model for the conformance suite; keep them in step.

A backend with a lower-precision format differs from its oracle (the same math in fp32, with the same weights
where the oracle holds them) only by roundings at fixed sites of each layer. Each rounding adds an error of
relative RMS size eps to the tensor it rounds, and a linear map, an RMSNorm or a residual add carries that error
at the same relative size (the random-walk argument: y = W (x + e) has |W e| / |W x| ~ |e| / |x| for weights
not aligned with e). Within one residual unit the sites' roundings are independent and add in quadrature; from
unit to unit the residual stream carries them and they may align, so they add linearly over the depth:

    rho(depth) = depth * (sqrt(sum_sites eps_site^2) + sum_matmuls 4 sqrt(K) u32)

The last term is fp32 accumulation in any fixed summation order a correct kernel may use (sequential chains,
pairs, blocks, trees: each partial sum is a random walk of at most |y|, each addition rounds by <= u32 of it;
4 standard deviations). From rho, for a compared tensor r (the oracle's) and e = engine - r:
    rms(e) <= rho rms(r)                          -> PCC(engine, r) >= sqrt(1 - (rho rms(r) / std(r))^2)
    max|e| <= z(N) rms(e), z(N) = sqrt(2 ln(2N / 1e-6))   (a sum of many small roundings is near-Gaussian:
                                                  its largest of N elements exceeds z(N) sigma with prob. < 1e-6)
The sites: the four matmul inputs (bf16, or int8 rows for the int8 weights, with an assumed crest factor), q, k, v
and the probabilities (bf16), and each of a layer's seven weight matrices where the format's weights differ from the
oracle's, with the error the format puts on these very weights (computed by rounding them). No constant here was
fitted to a measurement; ACCURACY.md lists the margins measured per kernel.
"""
from __future__ import annotations

import math

import torch

U32 = 2.0 ** -24
U_BF16 = 2.0 ** -8           # bf16 round-to-nearest: |x^ - x| <= 2^-8 |x|
EPS_BF16 = U_BF16 / math.sqrt(3)   # its RMS: the error is uniform over +-half an ulp, and an ulp <= 2^-7 |x|
KAPPA_ACT = 8.0              # crest factor (max|row| / rms(row)) assumed for activation rows quantised to int8
LAMBDA = 4.0                 # standard deviations of the accumulation-order term


def eps_int8(kappa: float) -> float:
    """Symmetric int8 with step a / 127 (a = max |row|): error uniform over +-step/2, RMS step / sqrt(12),
    relative to the row's RMS: kappa / (127 sqrt(12))."""
    return kappa / (127 * math.sqrt(12))


def z_factor(n: int) -> float:
    return math.sqrt(2 * math.log(2 * max(n, 1) / 1e-6))


class UnitModel:
    """rho per residual unit (one expert layer, or action_in_proj / the output head at depth 1) for a format.

    act: the matmul-input activations rounded per unit ('bf16', or 'int8' for the int8 weights' u8 rows);
    attention_bf16: q, k, v and the probabilities rounded to bf16 (the cpu / cuda attention);
    weight_eps: per weight matrix of a layer (q, k, v, o, gate, up, down) the RMS relative error of the format's
    weights against the oracle's (weight_errors; empty when the oracle holds the same weights);
    K: the matmul reduction lengths of one unit (D, Hq d, I, d, and the keys attended)."""

    def __init__(self, act: str, attention_bf16: bool, weight_eps: list[float], K: list[int], extra_eps=()):
        a = EPS_BF16 if act == "bf16" else eps_int8(KAPPA_ACT)
        sites = [a] * 4                                  # qkv input, attention output, MLP input, silu * up
        if attention_bf16:
            sites += [EPS_BF16] * 4                      # q, k, v, probabilities
        sites += list(weight_eps)
        sites += list(extra_eps)
        self.rounding = math.sqrt(sum(e * e for e in sites))
        self.accumulation = sum(LAMBDA * math.sqrt(k) * U32 for k in K)
        self.per_unit = self.rounding + self.accumulation

    def rho(self, depth: int) -> float:
        return depth * self.per_unit


def rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt())


def std(t: torch.Tensor) -> float:
    t = t.double()
    return float((t - t.mean()).pow(2).mean().sqrt())


def pcc_floor(rho: float, ref: torch.Tensor) -> float:
    s = std(ref)
    if s == 0:
        return 0.0
    r = rho * rms(ref) / s
    return math.sqrt(1 - r * r) if r < 1 else 0.0


def max_abs_bound(rho: float, ref: torch.Tensor) -> float:
    return z_factor(ref.numel()) * rho * rms(ref)


def format_error(weights: str, w: torch.Tensor) -> float:
    """The relative RMS error the weight format puts on these weights [out, in], computed by rounding them as the
    engine does: bf16 round-to-nearest-even; int8 symmetric per output row (step max|row| / 127, RNE)."""
    w = w.float()
    if weights == "bf16":
        q = w.bfloat16().float()
    elif weights == "int8":
        a = w.abs().amax(1, keepdim=True)
        q = torch.where(a > 0, torch.round(w * (127 / a)) * (a / 127), torch.zeros_like(w))
    else:
        raise ValueError(f"no error model for weight format {weights!r}")
    return float((q - w).double().norm() / w.double().norm().clamp_min(1e-300))


def weight_errors(weights: str | None, layers: list[dict[str, torch.Tensor]]) -> list[float]:
    """Per matrix kind (the dicts' keys, one dict per layer) the largest error over the layers; none for fp32 and
    the block formats (the oracle holds the same block-quantised values)."""
    if weights in (None, "f32", "bfp8_b", "bfp4_b"):
        return []
    return [max(format_error(weights, lw[k]) for lw in layers) for k in layers[0]]
