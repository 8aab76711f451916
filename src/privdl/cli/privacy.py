"""Accounting and theory commands: account, covariance, rms-bounds."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from privdl.cli.common import (
    EDGE_PROBABILITY, GRAPH_SEED, PLUGIN, TOPOLOGY, Format, _Command, _fail, _network, _print_facts, app, console,
)
from privdl.errors import PrivdlError, ValidationError


class Unit(str, Enum):
    agent = "agent"
    example = "example"


class AccountantName(str, Enum):
    paper = "paper"
    tight = "tight"


class AnyAccountant(str, Enum):
    """``privdl account``'s accountants: agent level (paper, tight) and example level (rdp, pld)."""

    paper = "paper"
    tight = "tight"
    rdp = "rdp"
    pld = "pld"


#: one default for every command that calibrates agent-level noise: the library's
#: (``privdl.privacy.accountants.DEFAULT_AGENT_ACCOUNTANT``, not imported here to keep the CLI's start fast; a test
#: holds them equal) — the same ε gives the same noise in ``account``, ``covariance`` and a run
DEFAULT_ACCOUNTANT = AccountantName.tight
#: the same for example-level noise (``privdl.privacy.example_accountant.DEFAULT_EXAMPLE_ACCOUNTANT``: a new
#: ``dp_sgd`` config's)
DEFAULT_EXAMPLE_ACCOUNTANT = AnyAccountant.pld
ACCOUNTANT_HELP = ("agent-level accountant: tight (exact Gaussian-DP composition, the default) or paper (seed 001, "
                   "Theorem 2: the papers' own)")
ACCOUNT_ACCOUNTANT_HELP = ("agent level: tight (exact Gaussian-DP composition, the default) or paper (seed 001, "
                           "Theorem 2); example level: pld (privacy loss distributions, the default) or rdp (Rényi "
                           "DP, what the reproductions use)")


@app.command(cls=_Command)
def account(
    manifest: Optional[Path] = typer.Option(None, "--manifest", help="re-account a finished run from the events in "
                                                                     "its manifest.json (nothing else is needed)"),
    unit: Unit = typer.Option(Unit.agent, "--unit", help="privacy unit"),
    accountant: Optional[AnyAccountant] = typer.Option(None, "--accountant", help=ACCOUNT_ACCOUNTANT_HELP),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="target ε (calibrate the noise)"),
    precision_bound: Optional[float] = typer.Option(None, "--precision-bound",
                                                    help="agent level: precision bound b on [R⁻¹]_ii (account ε)"),
    noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier",
                                                     help="example level: σ (noise std σC on the clipped sum)"),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="example level: Poisson rate q"),
    delta: float = typer.Option(1e-5, "--delta", help="δ of the (ε, δ) guarantee"),
    clip: Optional[float] = typer.Option(None, "--clip", help="agent level: clipping norm C (sensitivity 2C)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="number of noisy steps T (every noisy data access)"),
    pld_interval: Optional[float] = typer.Option(None, "--pld-interval",
                                                 help="example level, pld: the PLD's value discretisation interval "
                                                      "(default: adaptive, 2e-4 × the events' RDP ε at T = 2000, "
                                                      "scaled as 1/√T)"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
    plugin: list[str] = PLUGIN,
) -> None:
    """Accounting. Agent level: (ε, δ) → per-agent precision bound b, or b → ε. Example level (DP-SGD, the
    Poisson-subsampled Gaussian; PLD by default, ``--accountant rdp`` for Rényi DP): σ → ε, or ε → the smallest σ
    that meets it. ``--manifest PATH`` re-accounts a finished run from its privacy ledger's events alone, with the
    accountant its ledger names: ε per agent and the worst."""
    if manifest is not None:
        if accountant is not None or pld_interval is not None:
            _fail(ValidationError("--manifest re-accounts with the accountant the run's ledger names; drop "
                                  "--accountant / --pld-interval"))
        _account_manifest(manifest, fmt, plugin)
        return
    if plugin:
        _fail(ValidationError("--plugin applies to --manifest (plug-ins that register the event types or the "
                              "accountant a run's ledger names)"))
    try:
        if steps is None:
            raise PrivdlError("give --steps (or --manifest PATH to re-account a finished run)")
        example = unit is Unit.example
        chosen = accountant if accountant is not None else (DEFAULT_EXAMPLE_ACCOUNTANT if example else
                                                            AnyAccountant(DEFAULT_ACCOUNTANT.value))
        if example != (chosen in (AnyAccountant.rdp, AnyAccountant.pld)):
            raise ValidationError(
                f"--accountant {chosen.value} is an {'agent' if example else 'example'}-level accountant; at the "
                f"{unit.value} level use " + ("pld (the default) or rdp" if example else "tight (the default) or "
                                                                                          "paper"))
        if pld_interval is not None and chosen is not AnyAccountant.pld:
            raise ValidationError(f"--pld-interval applies to --unit example --accountant pld, not to "
                                  f"{unit.value} level {chosen.value}")
        wrong = [flag for flag, v, agent_only in (("--clip", clip, True), ("--precision-bound", precision_bound, True),
                                                  ("--noise-multiplier", noise_multiplier, False),
                                                  ("--sample-rate", sample_rate, False))
                 if v is not None and agent_only == (unit is Unit.example)]
        if wrong:
            raise ValidationError(
                f"{', '.join(wrong)} do{'es' if len(wrong) == 1 else ''} not apply at the {unit.value} level"
                + (" (example level is in units of the noise multiplier σ: noise std σ·C on the clipped sum, so C "
                   "does not change ε)" if unit is Unit.example else " (give --clip and --epsilon or "
                                                                      "--precision-bound)"))
        if unit is Unit.example:
            result = _account_example(chosen.value, epsilon, noise_multiplier, sample_rate, delta, steps, pld_interval)
            title = f"example-level accounting ({result['accountant']} accountant, Poisson-subsampled Gaussian)"
        else:
            result = _account_agent(AccountantName(chosen.value), epsilon, precision_bound, delta, clip, steps)
            title = f"agent-level accounting ({result['accountant']} accountant)"
    except (PrivdlError, ValueError) as exc:
        _fail(exc)
    _print_facts(result, fmt, title)


def _account_agent(accountant: "AccountantName", epsilon: float | None, precision_bound: float | None,
                   delta: float, clip: float | None, steps: int) -> dict:
    from privdl.privacy import get_accountant

    if (epsilon is None) == (precision_bound is None):
        raise PrivdlError("give exactly one of --epsilon or --precision-bound")
    if clip is None:
        raise PrivdlError("agent-level accounting needs --clip")
    acc = get_accountant(accountant.value)
    b = acc.bound(epsilon=epsilon, delta=delta, clip=clip, steps=steps) if epsilon is not None else precision_bound
    eps = acc.epsilon(bound=b, delta=delta, clip=clip, steps=steps)  # validates b before 1/b below
    return {
        "unit": "agent", "accountant": acc.name, "mechanism": "Gaussian, sensitivity 2C, precision b per step",
        "target_epsilon": epsilon, "delta": delta, "clip": clip, "steps": steps,
        "bound": b, "ldp_variance": 1.0 / b, "ldp_sigma": 1.0 / math.sqrt(b),
        "epsilon": eps, "reference": acc.reference,
    }


def _account_example(accountant: str, epsilon: float | None, noise_multiplier: float | None,
                     sample_rate: float | None, delta: float, steps: int, pld_interval: float | None) -> dict:
    from privdl.privacy.accountants import ACCOUNTANTS
    from privdl.privacy.example_accountant import calibrate_noise_multiplier, pld_epsilon, rdp_epsilon

    if (epsilon is None) == (noise_multiplier is None):
        raise PrivdlError("give exactly one of --epsilon or --noise-multiplier")
    if sample_rate is None:
        raise PrivdlError("example-level accounting needs --sample-rate")
    sigma = noise_multiplier if noise_multiplier is not None else \
        calibrate_noise_multiplier(epsilon=epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
                                   accountant=accountant, value_discretization_interval=pld_interval)
    if accountant == "pld":
        eps, interval = pld_epsilon(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=delta,
                                    value_discretization_interval=pld_interval)
        detail = {"value_discretization_interval": interval,
                  "interval": "given" if pld_interval is not None else
                              "adaptive (2e-4 × the events' RDP ε at T = 2000, scaled as 1/√T)"}
    else:
        eps, order = rdp_epsilon(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=delta)
        detail = {"order": order}
    return {"unit": "example", "accountant": accountant, "mechanism": "Poisson-subsampled Gaussian (DP-SGD)",
            "target_epsilon": epsilon, "noise_multiplier": sigma, "sample_rate": sample_rate, "steps": steps,
            "delta": delta, "epsilon": eps, **detail, "reference": ACCOUNTANTS.get(accountant).reference}


def _account_manifest(path: Path, fmt: "Format", plugins: list[str] = ()) -> None:
    """Re-account a finished run from the events its manifest's ledger stores, after checking that every number the
    ledger states agrees with them (:mod:`privdl.privacy.verify`: a field edited by hand is an error naming it). The
    plug-ins its run used (its config's ``plugins``) and ``plugins`` (``--plugin``) are imported first: they may
    register the event types and the accountant its ledger names."""
    from privdl.plugins import load_plugins, merged
    from privdl.privacy.verify import verify_ledger

    try:
        target = path / "manifest.json" if path.is_dir() else path
        if not target.is_file():
            raise PrivdlError(f"{target} does not exist (give a run's manifest.json or its folder)")
        try:
            data = json.loads(target.read_text())
            stated = data["privacy_ledger"][0]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError) as exc:
            raise PrivdlError(f"{target} is not a privdl run manifest with a privacy ledger ({exc})") from None
        config = data.get("config") if isinstance(data, dict) else None
        load_plugins(merged(config.get("plugins") if isinstance(config, dict) else None, plugins))
        try:
            again = verify_ledger(stated, "privacy_ledger[0]")
        except PrivdlError as exc:
            raise PrivdlError(f"{target}: {exc}") from None
    except (PrivdlError, OSError) as exc:
        _fail(exc)
    eps = again.epsilon
    per_agent = [{k: v for k, v in row.items() if k != "events"} for row in again.per_agent()]
    result = {"manifest": str(target), "unit": again.unit, "mechanism": again.mechanism,
              "accountant": again.accountant, "delta": again.delta,
              "epsilon": "inf" if eps is not None and math.isinf(eps) else eps, "guarantee": again.guarantee,
              "stated_epsilon": stated.get("epsilon"), "verified": True, "agents": len(per_agent),
              "per_agent": per_agent}
    for b, said in zip(again.beside, stated.get("beside", [])):  # the same noise for another unit
        other = b.epsilon
        result[f"{b.unit}_level_epsilon"] = "inf" if other is not None and math.isinf(other) else other
        result[f"{b.unit}_level_stated_epsilon"] = said.get("epsilon")
        result[f"{b.unit}_level_accountant"] = b.accountant
    if fmt is Format.json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    named = "no DP accountant" if again.accountant == "none" else f"{again.accountant} accountant"
    _print_facts({k: v for k, v in result.items() if k != "per_agent"}, fmt,
                 f"re-accounted from the manifest's events ({named}; every stated number agrees)")
    table = Table(title="per agent")
    for col in ("agent", "epsilon", "delta", "accesses", "noise_multiplier", "sample_rate"):
        table.add_column(col, justify="right")
    for row in per_agent:
        table.add_row(*(("" if row.get(c) is None else (f"{row[c]:.6g}" if isinstance(row[c], float) else
                                                         str(row[c]))) for c in ("agent", "epsilon", "delta",
                                                                                  "accesses", "noise_multiplier",
                                                                                  "sample_rate")))
    console.print(table)


class DesignName(str, Enum):
    ldp = "ldp"
    decor = "decor"
    whisper = "whisper"


@app.command(cls=_Command)
def covariance(
    mixing: Optional[Path] = typer.Option(None, "--mixing", help="mixing matrix W (.npy/.csv/.txt)"),
    topology: str = TOPOLOGY,
    n: int = typer.Option(20, "--n", help="number of agents"),
    p: float = EDGE_PROBABILITY,
    graph_seed: int = GRAPH_SEED,
    rule: str = typer.Option("metropolis_hastings", "--rule", help="mixing rule for a generated topology"),
    design: DesignName = typer.Option(DesignName.whisper, "--design", help="covariance design (seed 001)"),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="target ε per agent"),
    precision_bound: Optional[float] = typer.Option(None, "--precision-bound", help="b directly instead of ε"),
    delta: float = typer.Option(1e-5, "--delta", help="δ of the (ε, δ) guarantee"),
    clip: float = typer.Option(0.1, "--clip", help="clipping norm C"),
    steps: int = typer.Option(5000, "--steps", min=1, help="number of noisy steps T"),
    accountant: AccountantName = typer.Option(DEFAULT_ACCOUNTANT, "--accountant", help=ACCOUNTANT_HELP),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="HBC seed groups: global, edges, neighbourhoods, "
                                                             "groups:M (whisper solves problem (10))"),
    coalition_size: int = typer.Option(0, "--coalition-size", min=0, help="q: coalitions of up to q curious agents"),
    save_covariance: Optional[Path] = typer.Option(None, "--save-covariance", help="write R to this .npy file"),
    optimize_mixing: bool = typer.Option(False, "--optimize-mixing",
                                         help="whisper: choose the mixing weights on the graph's edges together with "
                                              "R (min Tr(W R Wᵀ) over both; the spectral gap 1 − SLEM held at least "
                                              "the Metropolis–Hastings weights')"),
    min_spectral_gap: Optional[float] = typer.Option(None, "--min-spectral-gap",
                                                     help="with --optimize-mixing: the least spectral gap 1 − SLEM(W) "
                                                          "(default: the Metropolis–Hastings weights' gap)"),
    save_mixing: Optional[Path] = typer.Option(None, "--save-mixing",
                                               help="with --optimize-mixing: write W to this file (.npy, or .csv/.txt "
                                                    "text; read back by [network] file, file_kind = \"mixing\")"),
    device: Optional[str] = typer.Option(None, "--device", help="whisper: torch device for the dual solver's "
                                                                "eigendecompositions, e.g. cuda (default: LAPACK on "
                                                                "the CPU)"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
) -> None:
    """Design the noise covariance R for a network: Tr(W R Wᵀ) against LDP and the central-DP bound."""
    import numpy as np

    from privdl.covariance import design_covariance
    from privdl.covariance.hbc import solve_hbc
    from privdl.covariance.seeds import coalition_worst_ratio, seed_groups
    from privdl.privacy import get_accountant

    try:
        if (epsilon is None) == (precision_bound is None):
            raise PrivdlError("give exactly one of --epsilon or --precision-bound")
        if coalition_size < 0:
            raise ValidationError(f"--coalition-size must be >= 0 (0: no curious agents), got {coalition_size}")
        if save_covariance is not None and (save_covariance.is_dir() or not save_covariance.name):
            raise ValidationError(f"--save-covariance {str(save_covariance)!r} is a folder; give a file name "
                                  f"(e.g. R.npy)")
        if save_covariance is not None and not save_covariance.parent.is_dir():
            raise ValidationError(f"--save-covariance {save_covariance}: folder {save_covariance.parent} does not "
                                  "exist")
        if optimize_mixing and design is not DesignName.whisper:
            raise ValidationError(f"--optimize-mixing applies to the whisper design only, not --design "
                                  f"{design.value} (it minimises problem (P)'s Tr(W R Wᵀ) over W and R together)")
        if not optimize_mixing and (min_spectral_gap is not None or save_mixing is not None):
            raise ValidationError("--min-spectral-gap and --save-mixing need --optimize-mixing")
        if optimize_mixing and (seeds not in (None, "global") or coalition_size > 0 or device is not None):
            raise ValidationError("--optimize-mixing designs problem (P) with one global seed on the CPU: it does "
                                  "not combine with --seeds, --coalition-size or --device")
        if save_mixing is not None and (save_mixing.is_dir() or not save_mixing.name
                                        or not save_mixing.parent.is_dir()):
            raise ValidationError(f"--save-mixing {str(save_mixing)!r}: give a file name in an existing folder "
                                  "(e.g. W.npy or W.csv)")
        if seeds is not None and not seeds.strip():
            raise ValidationError("--seeds is empty; give global, edges, neighbourhoods or groups:M")
        if device is not None:
            from privdl.covariance.dual_device import check_device

            if design is not DesignName.whisper or seeds not in (None, "global") or coalition_size > 0:
                raise ValidationError("--device applies to the whisper design's dual solver (problem (P)) only")
            check_device(device)
        net = _network(mixing, topology, n, p, graph_seed, rule)
        acc = get_accountant(accountant.value)
        b = acc.bound(epsilon=epsilon, delta=delta, clip=clip, steps=steps) if epsilon is not None \
            else float(precision_bound)
        hbc = seeds is not None or coalition_size > 0
        if design is DesignName.whisper and hbc and not (seeds in (None, "global") and coalition_size == 0):
            w = net.dense("the HBC covariance design", copies=8)
            result = solve_hbc(w, bound=b, groups=seed_groups(seeds or "global", w),
                               coalition_size=coalition_size, label=seeds or "global")
        elif optimize_mixing:
            from privdl.covariance.joint import design_joint, save_mixing_matrix

            joint = design_joint(net.dense("the joint mixing and covariance design", copies=8), b,
                                 min_spectral_gap=min_spectral_gap)
            result = joint.design
        else:
            result = design_covariance(design.value, net.dense("the covariance design", copies=8), bound=b,
                                       **({"device": device} if device is not None else {}))
        facts = result.summary()
        if optimize_mixing:
            facts.update(joint.summary())
            if save_mixing is not None:
                save_mixing_matrix(save_mixing, joint.W)
                facts["saved_mixing"] = str(save_mixing)
        if hbc:
            worst, where = coalition_worst_ratio(result.sigma_mix2, list(result.components or []), net.n,
                                                 coalition_size=coalition_size, bound=b)
            own = {"ldp": "none (independent noise)", "decor": "edges", "whisper": "global"}[design.value]
            facts.update({"seeds": seeds or own, "coalition_size": coalition_size,
                          "worst_coalition_ratio": worst, "worst_coalition": where,
                          "epsilon_against_coalitions": acc.epsilon(bound=b * worst, delta=delta, clip=clip,
                                                                    steps=steps)})
        facts.update({"accountant": acc.name, "epsilon": acc.epsilon(bound=b * result.max_precision_ratio,
                                                                     delta=delta, clip=clip, steps=steps),
                      "delta": delta, "clip": clip, "steps": steps, "network": net.description})
        if optimize_mixing:
            facts["network"] += ": weights optimized with R (--optimize-mixing)"
        if hbc:
            facts["design"] = f"{design.value}, HBC problem (10): seeds {facts['seeds']}, coalitions of up to " \
                              f"{coalition_size}"
            facts["guarantee"] = (f"({facts['epsilon_against_coalitions']:.6g}, {delta:g})-DP per agent against "
                                  f"coalitions of up to {coalition_size} curious agents; ({facts['epsilon']:.6g}, "
                                  f"{delta:g}) against an observer outside every coalition ({acc.name} accountant)")
        else:
            facts["guarantee"] = (f"({facts['epsilon']:.6g}, {delta:g})-DP per agent, agent level ({acc.name} "
                                  "accountant)")
        if not str(facts.get("solver", "dual")).lower().startswith("dual"):
            for key in ("duality_gap", "iterations", "relative_duality_gap"):  # the dual solver's, not a conic's
                facts.pop(key, None)
        if fmt is Format.table:
            facts.pop("worst_coalition", None)  # a nested dict: JSON only
        if save_covariance is not None:
            np.save(save_covariance, result.R)
            facts["saved"] = str(save_covariance)
    except (PrivdlError, ValueError, OSError) as exc:
        _fail(exc)
    _print_facts(facts, fmt, f"{design.value} covariance, n = {facts['n']} ({acc.name} accountant)")


@app.command("rms-bounds", cls=_Command)
def rms_bounds_command(
    mixing: Optional[Path] = typer.Option(None, "--mixing", help="combination matrix A (.npy/.csv/.txt)"),
    topology: str = TOPOLOGY,
    n: int = typer.Option(5, "--n", help="number of agents"),
    p: float = EDGE_PROBABILITY,
    graph_seed: int = GRAPH_SEED,
    rule: str = typer.Option("laplacian", "--rule", help="mixing rule for a generated topology (seed 002: laplacian)"),
    lazy: bool = typer.Option(False, "--lazy", help="use the lazy rule (I + A)/2 (positive definite, EDSG-RMS)"),
    dim: int = typer.Option(5, "--dim", min=1, help="L, the model dimension"),
    mu: float = typer.Option(1.0, "--mu", help="mean of the diagonal step-size factors"),
    sigma_mu: Optional[float] = typer.Option(None, "--sigma-mu", help="std of the diagonal entries (default σ_z)"),
    sigma_z: float = typer.Option(0.01, "--sigma-z", help="std of the off-diagonal entries"),
    smoothness: float = typer.Option(1.0, "--smoothness", help="δ: every J_k is δ-smooth"),
    strong_convexity: float = typer.Option(0.0, "--strong-convexity", help="ν: every J_k is ν-strongly convex"),
    gamma: Optional[float] = typer.Option(None, "--gamma", help="γ, the step size: also print the error bounds "
                                                               "(14), (16), (19), (21) at it"),
    tau: float = typer.Option(0.0, "--tau", help="τ, the protection parameter (for the bounds' conditions)"),
    gradient_noise: float = typer.Option(0.0, "--gradient-noise", help="σ_s² of Assumption 2 (0: exact gradients)"),
    heterogeneity: float = typer.Option(0.0, "--heterogeneity", help="H = ‖∇𝒥(𝒲*)‖² = Σ_k ‖∇J_k(w*)‖²"),
    init_centroid: float = typer.Option(0.0, "--init-centroid", help="E‖w̄₀ − w*‖²"),
    init_stacked: float = typer.Option(0.0, "--init-stacked", help="E‖𝒲₀‖² = Σ_k E‖w_k(0)‖²"),
    init_gradient: float = typer.Option(0.0, "--init-gradient", help="E‖∇𝒥(𝒲̄₀)‖² (EDSG-RMS's (19), (21))"),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="n (or N) for the bounds (default: their limit, "
                                                                "n → ∞)"),
    fmt: Format = typer.Option(Format.table, "--format", help="table (for people) or json (for tools)"),
) -> None:
    """Seed 002 Theorems 1–2: admissible γ and τ of DSG-RMS / EDSG-RMS for a network and random matrix; with
    --gamma also the error bounds (14)/(16) (DSG-RMS) and (19)/(21) (EDSG-RMS) — null where a condition fails."""
    from privdl.algorithms.rms_bounds import ErrorBounds, outside_conditions, rms_bounds

    try:
        net = _network(mixing, topology, n, p, graph_seed, rule, lazy)
        facts = rms_bounds(net.dense("seed 002's bounds", copies=3), dim=dim, mu=mu, sigma_mu=sigma_mu,
                           sigma_z=sigma_z, smoothness=smoothness,
                           strong_convexity=strong_convexity)
        if gamma is not None:
            named = {"--gamma": gamma, "--tau": tau, "--gradient-noise": gradient_noise,
                     "--heterogeneity": heterogeneity, "--init-centroid": init_centroid,
                     "--init-stacked": init_stacked, "--init-gradient": init_gradient}
            for opt, v in named.items():
                if not (math.isfinite(v) and (v > 0 if opt == "--gamma" else v >= 0 or opt == "--tau")):
                    raise ValidationError(f"{opt} must be a finite number{' > 0' if opt == '--gamma' else ' >= 0'}"
                                          f", got {v}")
            if rounds is not None and rounds < 1:
                raise ValidationError(f"--rounds must be >= 1, got {rounds}")
            at = math.inf if rounds is None else rounds
            facts.update({"gamma": gamma, "tau": tau, "rounds": "limit" if rounds is None else rounds})
            for name, (gap_eq, msd_eq) in (("dsg_rms", ("eq14", "eq16")), ("edsg_rms", ("eq19", "eq21"))):
                why = outside_conditions(name, facts, gamma=gamma, tau=tau)
                bounds = ErrorBounds(name, gamma, mu, strong_convexity, smoothness, facts["norm_D"],
                                     facts["sigma_mu_sq"], facts["theta_mu_sq"], gradient_noise, heterogeneity,
                                     net.n, init_centroid, init_stacked, init_gradient)
                facts[f"msd_bound_{msd_eq}"] = None if why["msd"] else bounds.msd(at)
                facts[f"gap_bound_{gap_eq}"] = None if why["gap"] else bounds.gap(at)
                facts[f"{name}_outside"] = "; ".join(dict.fromkeys(why["gap"] + why["msd"])) or "none"
    except PrivdlError as exc:
        _fail(exc)
    _print_facts(facts, fmt, f"seed 002 bounds, n = {net.n}, L = {dim}")
