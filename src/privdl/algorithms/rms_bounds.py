"""Admissible step sizes γ and protection parameters τ of seed 002's Theorems 1 and 2 (DSG-RMS, EDSG-RMS).

From the combination matrix A (symmetric, doubly stochastic) with eigenvalues 1 = λ₁ > λ₂ ≥ … ≥ λ_K:
‖D‖ = max_{ℓ≥2} |λ_ℓ| (the largest non-unit eigenvalue modulus), ‖D − I‖ = max_{ℓ≥2} |λ_ℓ − 1| and
σ_b = min_{ℓ≥2} λ_ℓ (EDSG-RMS needs 0 < λ_ℓ < 1: a positive-definite A). From the random matrix (Assumption 3):
σ_μ² = σ_{μ,k}² + (L − 1)σ_z² and θ_μ² = μ² + σ_μ². δ is the smoothness of every J_k (Assumption 4) and ν its
strong convexity (Assumption 5; ν = 0 for the convex case). The bounds, as printed in the seed:

* (12) DSG-RMS, convex:            γ ≤ μ(1 − ‖D‖) / (14 δ θ_μ²)
* (13) DSG-RMS:                    |τ| < (1 − ‖D‖) / (√8 ‖D − I‖)
* (15) DSG-RMS, strongly convex:   γ ≤ μν(1 − ‖D‖) / (64 θ_μ² δ²) · √(ν/δ)
* (17) EDSG-RMS, convex:           γ ≤ min{(1 − ‖D‖)σ_b^½ / (28 δ (σ_μ + μ)), μ / (2δ(2μ² + σ_μ²))}
* (18) EDSG-RMS:                   |τ| ≤ (1 − ‖D‖)σ_b^½ / √(32(1 − σ_b))
* (20) EDSG-RMS, strongly convex:  γ ≤ min{(1 − ‖D‖)σ_b^½ / (40(σ_μ + μ)δ) · √(ν/δ), μν(1 − ‖D‖) / (64(σ_μ² + μ²)δ²)}

They are sufficient conditions (the seed's proofs are omitted), usually far below the step sizes its experiments use;
a run outside them gets a warning naming the bound, never an error.

Inside them the theorems bound two errors (:class:`ErrorBounds`), with H = ‖∇𝒥(𝒲*)‖² = Σ_k ‖∇J_k(w*)‖² (the
heterogeneity), σ_s² the gradient-noise bound of Assumption 2, e₀ = ‖w̄₀ − w*‖², W₀ = ‖𝒲₀‖² = Σ_k ‖w_k(0)‖² and
G₀ = ‖∇𝒥(𝒲̄₀)‖² = Σ_k ‖∇J_k(w̄₀)‖² (the initial errors, exact for a run whose start is known), D = ‖D‖:

* (14) DSG-RMS, the average optimality gap (1/N) Σ_{n=1}^{N} (J(w̄_{n−1}) − J(w*)) ≤
  2e₀/(γμN) + 12δW₀/(N(1 − D)K) + 12γ²θ_μ²δD²/(1 − D)·(8H/((1 − D)K) + σ_s²) + γ/(μK)·(8σ_μ²H/K + θ_μ²σ_s²/2);
* (16) DSG-RMS, ν > 0, the centroid's mean-square error ‖w̄_n − w*‖² ≤ (1 − γμν/8)ⁿ(e₀ + W₀/K)
  + 8γ/(μνK)·(4σ_μ²H/K + θ_μ²σ_s²) + 48γ²θ_μ²δD²/(ν(1 − D))·(8H/((1 − D)K) + σ_s²);
* (19) EDSG-RMS: 2e₀/(γμN) + 48δ(3 − D)W₀/(NK(1 − D)²) + 96γ²μ²δG₀/(NK(1 − D)²)
  + 144γ²δD²/(1 − D)·(3σ_μ²H/((1 − D)K) + θ_μ²σ_s²) + 2γ/(μK)·(4σ_μ²H/K + θ_μ²σ_s²);
* (21) EDSG-RMS, ν > 0: (1 − γμν/8)ⁿ(e₀ + (3 − D)W₀/(K(1 − D)) + 2γ²μ²G₀/(K(1 − D)))
  + 8γ/(μνK)·(4σ_μ²H/K + θ_μ²σ_s²) + 576γ²δD²/(ν(1 − D))·(3σ_μ²H/((1 − D)K) + θ_μ²σ_s²).

(21) as printed opens the parenthesis after (1 − γμν/8)ⁿ and never closes it; we close it where (16) does, before
the steady-state terms (which do not decay with n in any analysis of this kind). Expectations over the initial model
are replaced by the run's own values (its start is a public draw we know).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.mechanisms.rms import RandomMatrixStepSize
from privdl.runtime_spec import RuntimeSpec


def spectrum_facts(W: np.ndarray) -> dict[str, float]:
    """‖D‖, ‖D − I‖ and σ_b of a symmetric combination matrix."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 2:
        raise ValidationError("the combination matrix must be square with at least 2 agents")
    if not np.allclose(W, W.T, atol=1e-12):
        raise ValidationError("seed 002's bounds need a symmetric combination matrix")
    ev = np.sort(np.linalg.eigvalsh(W))[::-1]
    rest = ev[1:]
    return {"norm_D": float(np.abs(rest).max()), "norm_D_minus_I": float(np.abs(rest - 1).max()),
            "sigma_b": float(rest.min())}


def rms_bounds(W: np.ndarray, *, dim: int, mu: float = 1.0, sigma_mu: float | None = None, sigma_z: float = 0.01,
               smoothness: float, strong_convexity: float = 0.0) -> dict[str, float | None]:
    """Theorems 1–2's admissible γ and τ (None where a bound does not apply, e.g. EDSG-RMS with an A that is not
    positive definite, or the strongly convex bounds at ν = 0)."""
    if not (0 < smoothness < math.inf and 0 <= strong_convexity <= smoothness and dim >= 1):
        raise ValidationError(f"rms bounds need a finite smoothness δ > 0, a strong convexity 0 <= ν <= δ (a "
                              f"function cannot curve more than it is smooth) and L >= 1; got δ = {smoothness}, "
                              f"ν = {strong_convexity}, L = {dim}")
    matrix = RandomMatrixStepSize(mu=mu, sigma_mu=sigma_z if sigma_mu is None else sigma_mu, sigma_z=sigma_z)
    f = spectrum_facts(W)
    gap = 1.0 - f["norm_D"]
    s2, th2 = matrix.sigma_mu_sq_total(dim), matrix.theta_mu_sq(dim)
    d, nu, sb = smoothness, strong_convexity, f["sigma_b"]
    out: dict[str, float | None] = {**f, "sigma_mu_sq": s2, "theta_mu_sq": th2}
    out["dsg_rms_gamma_convex_eq12"] = mu * gap / (14 * d * th2)
    out["dsg_rms_tau_eq13"] = gap / (math.sqrt(8) * f["norm_D_minus_I"])
    out["dsg_rms_gamma_strongly_convex_eq15"] = (mu * nu * gap / (64 * th2 * d * d) * math.sqrt(nu / d)
                                                 if nu > 0 else None)
    pd = 0 < sb < 1
    s = math.sqrt(s2)
    out["edsg_rms_gamma_convex_eq17"] = (min(gap * math.sqrt(sb) / (28 * d * (s + mu)), mu / (2 * d * (2 * mu**2 + s2)))
                                         if pd else None)
    out["edsg_rms_tau_eq18"] = gap * math.sqrt(sb) / math.sqrt(32 * (1 - sb)) if pd else None
    out["edsg_rms_gamma_strongly_convex_eq20"] = (
        min(gap * math.sqrt(sb) / (40 * (s + mu) * d) * math.sqrt(nu / d), mu * nu * gap / (64 * (s2 + mu**2) * d * d))
        if pd and nu > 0 else None)
    return out


def warn_outside(name: str, bounds: dict[str, float | None], *, gamma: float, tau: float) -> list[str]:
    """Warnings (also issued with :func:`warnings.warn`) for a run of ``name`` whose γ or τ lies outside the seed's
    sufficient conditions."""
    prefix = "dsg_rms" if name in ("dsg_rms", "dsgt_rms") else "edsg_rms" if name == "edsg_rms" else None
    if prefix is None:
        return []
    tau_key = f"{prefix}_tau_eq13" if prefix == "dsg_rms" else f"{prefix}_tau_eq18"
    gamma_keys = [k for k in bounds if k.startswith(f"{prefix}_gamma")]
    msgs = []
    for key in gamma_keys:
        bound = bounds[key]
        if bound is not None and gamma > bound:
            msgs.append(f"γ = {gamma:g} > {key.rsplit('_', 1)[-1]}'s {bound:.3g}")
    bound = bounds.get(tau_key)
    if bound is not None and (abs(tau) >= bound if tau_key.endswith("eq13") else abs(tau) > bound):  # (13) is strict
        msgs.append(f"|τ| = {abs(tau):g} > {tau_key.rsplit('_', 1)[-1]}'s {bound:.3g}")
    if msgs:
        warnings.warn(f"{name} runs outside seed 002's sufficient conditions ({'; '.join(msgs)}): convergence is "
                      "not guaranteed by Theorems 1–2 (privdl rms-bounds)", stacklevel=3)
    return msgs


#: The algorithms Theorems 1–2 cover (DSGT-RMS is Remark 2's extension, without a theorem).
THEOREMS = {"dsg_rms": ("eq14", "eq16"), "edsg_rms": ("eq19", "eq21")}


@dataclass(frozen=True)
class ErrorBounds:
    """The right sides of (14)/(16) (``name`` "dsg_rms") or (19)/(21) ("edsg_rms") for one configuration."""

    name: str
    gamma: float
    mu: float
    nu: float  # strong convexity ν (0: only the gap bound)
    delta: float  # smoothness δ
    norm_D: float
    sigma_mu_sq: float
    theta_mu_sq: float
    sigma_s_sq: float  # Assumption 2's gradient-noise bound
    heterogeneity: float  # H = ‖∇𝒥(𝒲*)‖²
    agents: int  # K
    init_centroid: float  # e₀ = ‖w̄₀ − w*‖²
    init_stacked: float  # W₀ = ‖𝒲₀‖²
    init_gradient: float  # G₀ = ‖∇𝒥(𝒲̄₀)‖² (EDSG-RMS only)

    def __post_init__(self) -> None:
        if self.name not in THEOREMS:
            raise ValidationError(f"seed 002's error bounds cover {', '.join(THEOREMS)}, not {self.name!r}")

    def gap(self, rounds: float) -> float:
        """(14) or (19): a bound on the expected average optimality gap over ``rounds`` = N ≥ 1 rounds (inf: its
        limit). Both bounds bound expectations: one run's values may exceed them, a mean over seeds should not."""
        if not rounds >= 1:
            raise ValidationError(f"the average gap needs N >= 1 rounds, got {rounds}")
        g, mu, d, D, K = self.gamma, self.mu, self.delta, self.norm_D, self.agents
        s2, th2, ss2, H = self.sigma_mu_sq, self.theta_mu_sq, self.sigma_s_sq, self.heterogeneity
        inv_n = 0.0 if math.isinf(rounds) else 1.0 / rounds
        if self.name == "dsg_rms":
            return (2 * self.init_centroid * inv_n / (g * mu) + 12 * d * self.init_stacked * inv_n / ((1 - D) * K)
                    + 12 * g * g * th2 * d * D * D / (1 - D) * (8 * H / ((1 - D) * K) + ss2)
                    + g / (mu * K) * (8 * s2 * H / K + th2 * ss2 / 2))
        return (2 * self.init_centroid * inv_n / (g * mu)
                + 48 * d * (3 - D) * self.init_stacked * inv_n / (K * (1 - D) ** 2)
                + 96 * g * g * mu * mu * d * self.init_gradient * inv_n / (K * (1 - D) ** 2)
                + 144 * g * g * d * D * D / (1 - D) * (3 * s2 * H / ((1 - D) * K) + th2 * ss2)
                + 2 * g / (mu * K) * (4 * s2 * H / K + th2 * ss2))

    def msd(self, rounds: float) -> float | None:
        """(16) or (21): a bound on E‖w̄_n − w*‖² at round n = ``rounds`` ≥ 0 (inf: its limit); None when ν = 0."""
        if not rounds >= 0:
            raise ValidationError(f"the mean-square bound needs n >= 0, got {rounds}")
        if self.nu <= 0:
            return None
        g, mu, nu, d, D, K = self.gamma, self.mu, self.nu, self.delta, self.norm_D, self.agents
        s2, th2, ss2, H = self.sigma_mu_sq, self.theta_mu_sq, self.sigma_s_sq, self.heterogeneity
        decay = 0.0 if math.isinf(rounds) else (1 - g * mu * nu / 8) ** rounds
        steady = 8 * g / (mu * nu * K) * (4 * s2 * H / K + th2 * ss2)
        if self.name == "dsg_rms":
            start = self.init_centroid + self.init_stacked / K
            return decay * start + steady + 48 * g * g * th2 * d * D * D / (nu * (1 - D)) * (8 * H / ((1 - D) * K) + ss2)
        start = (self.init_centroid + (3 - D) * self.init_stacked / (K * (1 - D))
                 + 2 * g * g * mu * mu * self.init_gradient / (K * (1 - D)))
        return decay * start + steady + 576 * g * g * d * D * D / (nu * (1 - D)) * (3 * s2 * H / ((1 - D) * K) + th2 * ss2)


def outside_conditions(name: str, bounds: dict[str, float | None], *, gamma: float, tau: float) -> dict[str, list[str]]:
    """Which of Theorem 1's or 2's conditions a run with step ``gamma`` and protection ``tau`` violates, for the gap
    bound ("gap": (12)+(13), or (17)+(18)) and the mean-square bound ("msd": (15)+(13), or (20)+(18); also ν > 0)."""
    if name not in THEOREMS:
        raise ValidationError(f"seed 002's theorems cover {', '.join(THEOREMS)}, not {name!r}")
    if name == "dsg_rms":
        tau_key, gap_key, msd_key = "dsg_rms_tau_eq13", "dsg_rms_gamma_convex_eq12", "dsg_rms_gamma_strongly_convex_eq15"
        tau_ok = bounds[tau_key] is not None and abs(tau) < bounds[tau_key]  # (13) is strict
    else:
        tau_key, gap_key, msd_key = "edsg_rms_tau_eq18", "edsg_rms_gamma_convex_eq17", "edsg_rms_gamma_strongly_convex_eq20"
        tau_ok = bounds[tau_key] is not None and abs(tau) <= bounds[tau_key]
    out: dict[str, list[str]] = {"gap": [], "msd": []}
    eq = lambda key: key.rsplit("_", 1)[-1]  # noqa: E731
    if bounds[tau_key] is None:  # (EDSG-RMS only)
        why = "A is not positive definite (σ_b ≤ 0 or ≥ 1): Theorem 2 does not apply"
        return {"gap": [why], "msd": [why]}
    if not tau_ok:
        why = f"|τ| = {abs(tau):g} outside {eq(tau_key)}'s {bounds[tau_key]:.3g}"
        out["gap"].append(why)
        out["msd"].append(why)
    for part, key in (("gap", gap_key), ("msd", msd_key)):
        bound = bounds[key]
        if bound is None:  # (only the strongly convex bound, at ν = 0)
            out[part].append("ν = 0: the task is not strongly convex")
        elif gamma > bound:
            out[part].append(f"γ = {gamma:g} > {eq(key)}'s {bound:.3g}")
    return out


def run_error_bounds(algorithm, network, task, schedule, x0: torch.Tensor | None, *, mechanism: str = "none",
                     every_round: bool = True) -> tuple[ErrorBounds | None, dict[str, list[str]]]:
    """The error bounds of one run (``x0``: its common initial model; None if unknown) and, per bound ("gap",
    "msd"), the conditions it violates — a bound applies only where its list is empty. Beyond γ and τ: a task that
    knows δ, ν, H and σ_s² (Assumption 2: exact gradients), a fixed optimum (no ``switch_at``), a constant step
    size, a dense W (the spectrum), no gradient mechanism (``mechanism`` "none": a DP mechanism clips or noises the
    gradient, which the theorems do not cover), and for the gap bound every round recorded (``every_round``: the
    running ``avg_gap`` is the theorem's average only then)."""
    name = algorithm.name
    if name not in THEOREMS or algorithm.rms is None:
        return None, {}
    general = []
    if mechanism != "none":
        general.append(f"the gradient mechanism {mechanism!r} clips or noises the gradient: not the theorems' setting")
    needed = ("smoothness", "strong_convexity", "heterogeneity", "gradient_noise_bound", "stacked_gradient_sq",
              "optimum")
    if not all(hasattr(task, a) for a in needed):
        general.append(f"task {task.name!r} does not know its constants (δ, ν, H, σ_s²)")
    elif task.gradient_noise_bound is None:
        general.append("Assumption 2 fails: one-sample gradients have a noise that grows with ‖w − w°_k‖, no finite "
                       "σ_s² bounds it (exact_gradient = true satisfies it with σ_s² = 0)")
    elif getattr(task, "switch_at", 0):
        general.append("the optimum switches (switch_at): the theorems assume a fixed w*")
    if getattr(schedule, "name", "constant") != "constant":
        general.append(f"the step size is not constant (schedule {schedule.name!r})")
    if network.sparse:
        general.append("a sparse network: W's spectrum is not computed")
    if x0 is None:
        general.append("the initial model is not known")
    if general:
        return None, {"gap": list(general), "msd": list(general)}
    if not every_round:  # (the mean-square bound is pointwise in n: any recorded round will do)
        reasons_gap = ["avg_gap averages only the recorded rounds (eval_every > 1): not the theorem's (1/N)Σ over "
                       "every round"]
    else:
        reasons_gap = []
    rms = algorithm.rms
    dim = task.dim
    gamma, tau = float(schedule(1)), float(getattr(algorithm.wire, "tau", 0.0))
    table = rms_bounds(network.W, dim=dim, mu=rms.mu, sigma_mu=rms.sigma_mu, sigma_z=rms.sigma_z,
                       smoothness=task.smoothness, strong_convexity=task.strong_convexity)
    reasons = outside_conditions(name, table, gamma=gamma, tau=tau)
    reasons["gap"] += reasons_gap
    start = x0.to(torch.float64).reshape(-1)
    w_star = task.optimum(0).to(torch.float64)
    bounds = ErrorBounds(
        name=name, gamma=gamma, mu=rms.mu, nu=task.strong_convexity, delta=task.smoothness,
        norm_D=table["norm_D"], sigma_mu_sq=table["sigma_mu_sq"], theta_mu_sq=table["theta_mu_sq"],
        sigma_s_sq=float(task.gradient_noise_bound), heterogeneity=float(task.heterogeneity), agents=network.n,
        init_centroid=float(((start - w_star) ** 2).sum()), init_stacked=network.n * float((start ** 2).sum()),
        init_gradient=float(task.stacked_gradient_sq(start)))
    return bounds, reasons


def bound_rows(bounds: ErrorBounds | None, reasons: dict[str, list[str]],
               rounds: Iterable[int]) -> list[tuple[int, str, float]]:
    """Metric rows ``msd_bound`` (n ≥ 0) and ``gap_bound`` (N ≥ 1) at ``rounds``, for the bounds that apply."""
    if bounds is None:
        return []
    rows = []
    for t in sorted(set(rounds)):
        if not reasons.get("msd") and bounds.nu > 0:
            rows.append((t, "msd_bound", float(bounds.msd(t))))
        if not reasons.get("gap") and t >= 1:
            rows.append((t, "gap_bound", float(bounds.gap(t))))
    return rows


def with_error_bounds(cfg: dict, c, rows: list[tuple[int, str, float]]
                      ) -> tuple[list[tuple[int, str, float]], dict | None]:
    """A finished run's rows (config ``cfg``, components ``c``) with the error bounds at its recorded rounds
    (:func:`bound_rows`, where every condition of :func:`run_error_bounds` holds) and the manifest's account of
    them (the constants, or why a bound is absent); a run of another algorithm unchanged, with None."""
    from privdl.keys import Keys

    if c.algorithm.name not in THEOREMS or c.algorithm.rms is None:
        return rows, None
    x0 = None
    if not RuntimeSpec.of(cfg).agreed:  # the common start, a public draw of the run's root
        x0 = c.task.init_params(Keys(int(cfg["seed"]), c.network.n).generator("init"))
    bounds, reasons = run_error_bounds(c.algorithm, c.network, c.task, c.schedule, x0,
                                       mechanism=cfg.get("mechanism", {}).get("name", "none"),
                                       every_round=int(cfg.get("eval_every") or 0) == 1)
    if bounds is not None:
        first = [v for t, m, v in rows if t == 0 and m == "centroid_msd"]
        if first and not math.isclose(first[0], bounds.init_centroid, rel_tol=1e-9, abs_tol=1e-12):
            bounds, reasons = None, {k: ["the run did not start from its root's initial model"] for k in ("gap", "msd")}
    account = {"theorem": "seed 002 Theorem " + ("1" if c.algorithm.name == "dsg_rms" else "2"),
               "bounds": dict(zip(("gap_bound", "msd_bound"), THEOREMS[c.algorithm.name])),
               "absent": {f"{k}_bound": v for k, v in reasons.items() if v}}
    if bounds is not None:
        account["constants"] = {k: v for k, v in vars(bounds).items() if k != "name"}
    return rows + bound_rows(bounds, reasons, {t for t, _, _ in rows}), account


__all__ = ["ErrorBounds", "with_error_bounds", "bound_rows", "run_error_bounds", "THEOREMS", "outside_conditions", "rms_bounds", "spectrum_facts", "warn_outside"]
