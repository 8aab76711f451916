"""The closed form behind "no agent-level design trains the CNN" (issue 46): the noise the network average
accumulates against the largest signal the clipped gradients can accumulate, whatever T and η.

**Derivation.** An agent-level Gaussian design adds to the n agents' clipped gradients (‖g_i‖ ≤ C) a noise of
per-coordinate covariance R (n × n) per access, calibrated over T accesses so that each agent is μ-GDP with
replace-one sensitivity Δ = 2C: privdl's ``tight`` agent accountant sets the precision bound b = μ²/(4C²T)
(:func:`privdl.privacy.agent_accountant.tight_bound`, μ = ``gdp_mu_for(ε, δ)``), and every design keeps
[R⁻¹]_ii ≤ b (the RDP and paper accountants give a smaller b, i.e. more noise). With doubly stochastic mixing the
network average moves by x̄_{t+1} = x̄_t − η_t(ḡ_t + ν̄_t), ν̄_t the mean of the agents' noise: per coordinate
variance 𝟙ᵀR𝟙/n². After T steps the accumulated noise Σ_t η_t ν̄_t has E‖·‖² = (Σ_t η_t²)·d·𝟙ᵀR𝟙/n², while the
accumulated signal ‖Σ_t η_t ḡ_t‖ ≤ C·Σ_t η_t. Their ratio

    r = √(Σ_t η_t² · d · 𝟙ᵀR𝟙) / (n · C · Σ_t η_t) ≥ √(d · 𝟙ᵀR𝟙 / T) / (n · C)    (Cauchy–Schwarz: (Σ η_t)² ≤ TΣ η_t²)

does not depend on η (and, with R ∝ T, not on T). For independent noise (LDP, and Muffliato at its worst-pair
calibration, whose σ is LDP's up to the RDP conversion) R = I/b, 𝟙ᵀR𝟙 = n/b = 4C²Tn/μ², so

    r ≥ 2√d / (μ√n),

with equality for the tight accountant, a constant η and accesses = steps. For correlated noise (DECOR, Whisper) the
bound that holds for every R with [R⁻¹]_ii ≤ b is √n smaller: 𝟙ᵀR𝟙 ≥ n²/(𝟙ᵀR⁻¹𝟙) and 𝟙ᵀR⁻¹𝟙 ≤ Σ_ij √([R⁻¹]_ii[R⁻¹]_jj)
≤ n²b, so 𝟙ᵀR𝟙 ≥ 1/b (the trusted curator's noise on the sum) and r ≥ 2√d/(μn). Zip-DL's zero-sum noise leaves the
average (r = 0) and states no guarantee against an eavesdropper; the mean-pair Muffliato row is pairwise too.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from privdl.privacy.agent_accountant import gdp_mu_for


def closed_form(*, d: int, n: int, epsilon: float, delta: float, correlated: bool = False) -> float:
    """2√d/(μ√n) (independent noise) or 2√d/(μn) (any Gaussian design with [R⁻¹]_ii ≤ b), μ = gdp_mu_for(ε, δ)."""
    mu = gdp_mu_for(epsilon=float(epsilon), delta=float(delta))
    return 2.0 * math.sqrt(d) / (mu * (n if correlated else math.sqrt(n)))


def accumulated_ratio(mechanism, *, d: int, etas: Sequence[float]) -> float:
    """√(Σ η_t² · d · 𝟙ᵀR𝟙)/(n · C · Σ η_t) for a mechanism's calibrated per-access covariance R (``design.R``) over
    the step sizes ``etas`` of the gradient steps (module doc)."""
    R = np.asarray(mechanism.design.R, dtype=np.float64)
    n, etas = R.shape[0], np.asarray(etas, dtype=np.float64)
    return float(math.sqrt(float((etas**2).sum()) * d * float(R.sum())) / (n * mechanism.clip * float(etas.sum())))


def design_ratios(specs: Sequence[tuple[str, str, str, dict, int]]) -> list[dict]:
    """Per (task, graph, method, run config, d) of an agent-level design (example-level ones are left out): the
    closed forms and, for a Gaussian design with a covariance R (LDP, DECOR, Whisper, Muffliato), its calibrated
    ratio at a constant step (:func:`accumulated_ratio`; NaN for Zip-DL, whose zero-sum noise leaves the average)."""
    from privdl.experiment.build import build_algorithm, build_network
    from privdl.mechanisms import MECHANISMS, make_mechanism
    from privdl.mechanisms.correlated import CorrelatedGaussian

    out = []
    for task, graph, method, cfg, d in specs:
        mech = dict(cfg["mechanism"])
        name = mech.pop("name")
        if name == "dp_sgd" or mech.get("clipping") == "per_example":  # example level: not what the bound is about
            continue
        net = build_network(cfg["network"], int(cfg["seed"]), cfg.get("base_dir"))
        eps, delta = float(mech.get("epsilon", math.nan)), float(mech.get("delta", 1e-5))
        row = {"task": task, "graph": graph, "method": method, "epsilon": eps, "d": d, "n": net.n,
               "bound_independent": closed_form(d=d, n=net.n, epsilon=eps, delta=delta),
               "bound_any_gaussian": closed_form(d=d, n=net.n, epsilon=eps, delta=delta, correlated=True),
               "calibrated": math.nan}
        kind = MECHANISMS.get(name)
        if isinstance(kind, type) and issubclass(kind, CorrelatedGaussian):  # DP-SGD (example level), Zip-DL: —
            m = make_mechanism(name, steps=build_algorithm(cfg).accesses(int(cfg["iterations"]), net.edges),
                               network=net, **mech)
            row["calibrated"] = accumulated_ratio(m, d=d, etas=[1.0] * int(cfg["iterations"]))
        out.append(row)
    return out


__all__ = ["accumulated_ratio", "closed_form", "design_ratios"]
