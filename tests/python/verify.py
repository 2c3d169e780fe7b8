"""Compare one engine `sample` run with the oracle: layers, Euler steps, action, trajectory.

Bounds are derived in docs/ACCURACY.md; in short, for the fp32 reference backend every compared tensor
must satisfy max|engine - oracle| <= u * scale * depth * (sqrt(K) + phase) (compare.fp32_bound), with the PCC
floor that max-abs bound implies; for the bf16 / int8 / block formats the error model of error_model.py gives a
relative RMS bound rho(depth), hence a PCC floor and a max-abs bound for each tensor.
"""
from __future__ import annotations

import math

import torch

from cli import Backend
import error_model as em
from compare import U32, Checks, fp32_bound, max_abs
from oracle import Checkpoint, Oracle, decode, v0_from_history

MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")


def pcc_implied(bound: float, ref: torch.Tensor) -> float:
    """The PCC floor a max-abs bound implies (rms(e) <= max|e|): for the fp32 bounds."""
    return em.pcc_floor(bound / max(em.rms(ref), 1e-300), ref)


def format_unit(ck: Checkpoint, backend: Backend, keys: int) -> em.UnitModel | None:
    """The error model's residual unit for a backend with bf16 activations (and the format's weights) against the
    fp32 oracle, for attention over `keys` rows; None for the fp32 reference backend (its fp32 bounds)."""
    if backend.name == "reference":
        return None
    layers = [{m: ck.w[f"expert.layers.{l}.{m}.weight"] for m in MATRICES} for l in range(ck.L)]
    wfmt = backend.weights or "bf16"
    return em.UnitModel("int8" if wfmt == "int8" else "bf16", True, em.weight_errors(wfmt, layers),
                        [ck.D, ck.Hq * ck.d, ck.I, ck.d, keys])


class Bounds:
    """The per-tensor max-abs bounds of one case (sizes, positions and input range fixed)."""

    def __init__(self, ck: Checkpoint, oracle: Oracle, xmax: float, backend: Backend):
        self.backend = backend
        f_max = max(float(ck.w.get("action_in_proj.timestep_fourier_encoder.freqs", torch.tensor(ck.ain["max_freq"])).max()),
                    ck.ain["max_freq"])
        self.phase_emb = 2 * math.pi * f_max * max(1.0, xmax)           # largest Fourier angle
        self.p_max = float(oracle.position_ids.abs().max())               # largest rope angle (inv_freq_0 = 1)
        self.K_emb = max(3 * ck.ain["F"], ck.ain["hidden"], ck.D)
        self.K_layer = max(ck.D, ck.Hq * ck.d, ck.I, oracle.P + oracle.T)
        self.L = ck.L
        self.unit = format_unit(ck, backend, oracle.P + oracle.T)

    def depth(self, what: str) -> int:
        if what == "emb":
            return 1
        if what in ("hidden", "v"):
            return self.L + (1 if what == "hidden" else 2)
        return int(what.split(".")[1]) + 2

    def accumulation_only(self, what: str, scale: float) -> float:
        """The sqrt(K) part of the fp32 bound alone (no angle rounding term), for the tables."""
        return fp32_bound(scale, self.K_emb if what == "emb" else self.K_layer, 0.0, self.depth(what))

    def max_abs_and_pcc(self, what: str, ref: torch.Tensor) -> tuple[float, float]:
        """(max-abs bound, PCC floor) of one compared tensor."""
        if self.unit is not None:
            rho = self.unit.rho(self.depth(what))
            return em.max_abs_bound(rho, ref), em.pcc_floor(rho, ref)
        b = self(what, float(ref.abs().max()))
        return b, pcc_implied(b, ref)

    def __call__(self, what: str, scale: float) -> float:
        """The fp32 bound (reference backend)."""
        if what == "emb":
            return fp32_bound(scale, self.K_emb, self.phase_emb, 1)
        phase = self.phase_emb + self.p_max
        if what == "hidden":
            return fp32_bound(scale, self.K_layer, phase, self.L + 1)
        if what == "v":
            return fp32_bound(scale, self.K_layer, phase, self.L + 2)
        return fp32_bound(scale, self.K_layer, phase, int(what.split(".")[1]) + 2)


def check_layers(checks: Checks, got: dict, ref: dict, bounds: Bounds):
    for name in ["emb"] + [f"layer.{l}" for l in range(bounds.L)] + ["hidden"]:
        if name not in got:
            checks.add(f"layers-out:{name} MISSING", torch.zeros(1), torch.ones(1), 0.0, 1.0)
            continue
        r = ref[name]
        checks.add(f"layers-out:{name}", got[name], r, *bounds.max_abs_and_pcc(name, r))


def oracle_gain(oracle: Oracle, noise: torch.Tensor, steps: int, base_action: torch.Tensor, eps: float = 1e-4) -> float:
    """max|d action| / max|d noise| for a small random perturbation: how much the sampler amplifies
    an error injected at x_0 (Fourier features up to 2*pi*100 make it large)."""
    g = torch.Generator().manual_seed(99)
    delta = eps * (2 * torch.rand(noise.shape, generator=g) - 1)
    pert = oracle.sample(noise + delta, steps)["action"]
    return max_abs(pert, base_action) / float(delta.abs().max())


def verify_sample(ck: Checkpoint, oracle: Oracle, res: dict, noise: torch.Tensor, steps: int, backend: Backend,
                  *, ego_xyz=None, ego_rot=None, v0_given=None, free_running: bool = True) -> Checks:
    checks = Checks()
    ref = oracle.sample(noise, steps)
    xmax = float(max(ref["x_steps"].abs().max(), res["x_steps"].abs().max() if "x_steps" in res else 0))
    bounds = Bounds(ck, oracle, xmax, backend)
    checks.bounds = bounds

    # 1. Per-layer hidden states of Euler step 0 (identical input x_0 = noise).
    if "layers" in res:
        check_layers(checks, res["layers"], ref["layers"], bounds)

    # 2. Every Euler step, teacher-forced: oracle step_fn at the engine's own x_k isolates the step's error.
    xs, vs = res.get("x_steps"), res.get("v_steps")
    times = ref["times"]
    tol_v, err_v = [], []
    if xs is not None and vs is not None:
        checks.add("x_0 == noise", xs[0], noise, 0.0)
        for k in range(steps):
            v_ref, _ = oracle.step(xs[k], times[k].expand(xs.shape[1]))
            tol, floor = bounds.max_abs_and_pcc("v", v_ref)
            tol_v.append(tol)
            err_v.append(checks.add(f"v_{k} (teacher-forced)", vs[k], v_ref, tol, floor).err)
            # Euler update in fp32: x + dt*v rounds twice.
            x_next = xs[k] + (times[k + 1] - times[k]) * vs[k]
            checks.add(f"x_{k + 1} = x_{k} + dt v_{k}", xs[k + 1], x_next, 2 * U32 * float(x_next.abs().max()) + 1e-30)
        checks.add("action == x_N", res["action"], xs[steps], 0.0)

    # 3. Free-running sample vs the oracle's own. Steps 1-2 already pin every step; this checks that the
    # end-to-end difference is no more than the per-step differences amplified by the sampler's gain.
    if free_running and tol_v and backend.name == "reference":
        gain = max(1.0, oracle_gain(oracle, noise, steps, ref["action"]))
        dts = (times[1:] - times[:-1]).tolist()
        tol_action = 2 * gain * sum(dt * e for dt, e in zip(dts, err_v)) + steps * 2 * U32 * xmax
        checks.add(f"action (free-running, gain {gain:.0f})", res["action"], ref["action"], tol_action,
                   pcc_implied(tol_action, ref["action"]))
    elif free_running:
        checks.note(f"[{backend.id}] free-running action: pcc {__import__('compare').pcc(res['action'], ref['action']):.6f} "
                    f"max|d| {max_abs(res['action'], ref['action']):.3e}")
        tol_action = None
    else:
        tol_action = None

    # 4. Trajectory: v0, then decode of the engine's own action (shared host code: tight for every backend).
    B = noise.shape[0]
    dt, T = ck.aspace["dt"], ck.aspace["T"]
    z = ego_xyz[:, -1, 2] if ego_xyz is not None else torch.zeros(B)
    if ego_xyz is not None:
        v0_ref = v0_from_history(ego_xyz, ego_rot, dt, ck.aspace["v_lambda"], ck.aspace["v_ridge"])
        H = ego_xyz.shape[1]
        # fp32 normal-equation solve: forward error <= cond(lhs) * n * u; cond ~ 45 for these histories.
        tol_v0 = 64 * H * U32 * max(1.0, float(v0_ref.abs().max()))
    else:
        v0_ref = torch.as_tensor(v0_given, dtype=torch.float64).expand(B)
        tol_v0 = U32 * max(1.0, float(v0_ref.abs().max()))
    checks.add("v0", res["v0"], v0_ref, tol_v0)
    xyz_d, yaw_d, rot_d = decode(ck, res["action"], res["v0"], z)
    vmax = float(res["v0"].abs().max()) + T * dt * ck.aspace["accel_std"] * (float(res["action"][..., 0].abs().max()) + 1)
    # Decode in fp32: T-term cumulative sums of terms <= vmax*dt, angles <= |yaw|.
    tol_xyz = 8 * T * U32 * (float(xyz_d.abs().max()) + vmax * T * dt + 1)
    tol_yaw = 8 * T * U32 * (float(yaw_d.abs().max()) + 1)
    checks.add("xyz (decode of engine action)", res["xyz"], xyz_d, tol_xyz)
    checks.add("yaw (decode of engine action)", res["yaw"], yaw_d, tol_yaw)
    checks.add("rot (decode of engine action)", res["rot"], rot_d, tol_yaw)

    # 5. End to end in metres: oracle action + oracle v0 decoded vs the engine's trajectory.
    xyz_o, _, _ = decode(ck, ref["action"], v0_ref, z)
    dev = max_abs(res["xyz"], xyz_o)
    checks.note(f"[{backend.id}] end-to-end trajectory deviation vs oracle: max {dev:.3e} m")
    if tol_action is not None:
        Tt = T * dt
        tol_traj = (Tt * (tol_v0 + Tt * ck.aspace["accel_std"] * tol_action)
                    + Tt * Tt * vmax * vmax * ck.aspace["curvature_std"] * tol_action + tol_xyz)
        checks.add("xyz end-to-end (m)", res["xyz"], xyz_o, tol_traj)
    return checks
