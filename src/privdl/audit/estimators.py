"""Empirical lower bounds on ε from membership guesses (SPEC §8; seed 004 App. D).

Multi-run (Jagielski et al. 2020; Nasr et al. 2021): models trained with the canary ("in") and without ("out");
a threshold τ on a score (higher = "looks like a member") gives TPR and FPR; any (ε, δ)-DP training satisfies
TPR ≤ e^ε FPR + δ and TNR ≤ e^ε FNR + δ, so ε ≥ log((TPR − δ)/FPR) and ε ≥ log((TNR − δ)/FNR). With
Clopper–Pearson bounds (lower for the numerator rate, upper for the denominator) the bound holds with the stated
confidence. The threshold is chosen on held-out models, never on the models that give the bound.

One-run (Steinke, Nasr, Jagielski 2023, Theorem 3 with δ): m canaries each included with probability 1/2 in one
training run; the auditor guesses "in" for the k₊ highest scores and "out" for the k₋ lowest and abstains on the
rest. Under (ε, δ)-DP the number of correct guesses v out of r is at most Binomial(r, e^ε/(1+e^ε)) in the tail,
plus a δ term; ε is rejected when P[W ≥ v] < β.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from privdl.errors import ValidationError


def clopper_pearson(successes: np.ndarray | int, trials: int, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Clopper–Pearson interval (lower, upper) for a binomial proportion (vectorised over successes)."""
    k = np.asarray(successes, dtype=float)
    a = (1 - confidence) / 2
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, stats.beta.ppf(a, k, trials - k + 1), 0.0)
        hi = np.where(k < trials, stats.beta.ppf(1 - a, k + 1, trials - k), 1.0)
    return lo, hi


def _rates(scores_in: np.ndarray, scores_out: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts of "in" guesses (score ≥ τ) among in-models (true positives) and out-models (false positives)."""
    s_in, s_out = np.sort(scores_in), np.sort(scores_out)
    tp = len(s_in) - np.searchsorted(s_in, thresholds, side="left")
    fp = len(s_out) - np.searchsorted(s_out, thresholds, side="left")
    return tp, fp


def _bounds(tp: np.ndarray, fp: np.ndarray, n_in: int, n_out: int, delta: float,
            confidence: float | None) -> np.ndarray:
    """ε lower bound for each threshold, the better of the two directions; point estimates when confidence=None."""
    if confidence is None:
        tpr_lo, tpr_hi = tp / n_in, tp / n_in
        fpr_lo, fpr_hi = fp / n_out, fp / n_out
    else:
        tpr_lo, tpr_hi = clopper_pearson(tp, n_in, confidence)
        fpr_lo, fpr_hi = clopper_pearson(fp, n_out, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = np.log(np.maximum(tpr_lo - delta, 0) / fpr_hi)
        reverse = np.log(np.maximum((1 - fpr_hi) - delta, 0) / (1 - tpr_lo))
    out = np.maximum(np.nan_to_num(direct, nan=-np.inf, posinf=np.inf, neginf=-np.inf),
                     np.nan_to_num(reverse, nan=-np.inf, posinf=np.inf, neginf=-np.inf))
    return out


@dataclass(frozen=True)
class ThresholdAudit:
    epsilon_lower: float  # with the stated confidence (0 when nothing is shown)
    epsilon_point: float  # the same threshold's point estimate
    threshold: float
    tpr: float
    fpr: float
    n_in: int
    n_out: int
    confidence: float

    def to_dict(self) -> dict[str, float]:
        return {k: (v if not (isinstance(v, float) and math.isinf(v)) else str(v)) for k, v in vars(self).items()}


def choose_threshold(scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float = 0.95) -> float:
    """The threshold whose Clopper–Pearson ε bound is largest on these (held-out) scores."""
    candidates = np.unique(np.concatenate([scores_in, scores_out]))
    tp, fp = _rates(scores_in, scores_out, candidates)
    bounds = _bounds(tp, fp, len(scores_in), len(scores_out), delta, confidence)
    return float(candidates[int(np.argmax(bounds))])


def threshold_audit(scores_in: np.ndarray, scores_out: np.ndarray, delta: float, *, held_out: float = 0.2,
                    confidence: float = 0.95, seed: int = 0) -> ThresholdAudit:
    """Multi-run audit: pick τ on a ``held_out`` fraction of the models, bound ε on the rest."""
    scores_in, scores_out = np.asarray(scores_in, float), np.asarray(scores_out, float)
    if min(len(scores_in), len(scores_out)) < 2:
        raise ValidationError("the audit needs at least 2 models trained with and 2 without the canary")
    if not 0 < held_out < 1:
        raise ValidationError(f"held_out must be in (0, 1), got {held_out}")
    rng = np.random.default_rng(seed)
    pin, pout = rng.permutation(len(scores_in)), rng.permutation(len(scores_out))
    k_in, k_out = max(1, int(held_out * len(scores_in))), max(1, int(held_out * len(scores_out)))
    tau = choose_threshold(scores_in[pin[:k_in]], scores_out[pout[:k_out]], delta, confidence)
    test_in, test_out = scores_in[pin[k_in:]], scores_out[pout[k_out:]]
    tp, fp = _rates(test_in, test_out, np.array([tau]))
    lower = float(_bounds(tp, fp, len(test_in), len(test_out), delta, confidence)[0])
    point = float(_bounds(tp, fp, len(test_in), len(test_out), delta, None)[0])
    return ThresholdAudit(max(lower, 0.0), point, tau, float(tp[0] / len(test_in)), float(fp[0] / len(test_out)),
                          len(test_in), len(test_out), confidence)


# ---- one-run audit ----------------------------------------------------------------------------------------------

def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[≥ v correct of r guesses] under (ε, δ)-DP with m canaries (Steinke et al. 2023, Theorem 3):
    P[Bin(r, p) ≥ v] + 2mδ · max_{1≤i≤v} P[v > Bin(r, p) ≥ v − i] / i, with p = e^ε/(1 + e^ε)."""
    if not 0 <= v <= r <= m:
        raise ValidationError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, p))
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    window = np.cumsum(stats.binom.pmf(v - i, r, p))  # P[v > W ≥ v − i]
    return min(tail + 2 * m * delta * float(np.max(window / i)), 1.0)


def one_run_epsilon(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε that ``v`` correct guesses out of ``r`` rejects at the given confidence (0 if none)."""
    beta = 1 - confidence
    if one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2 * hi
        if hi > 200:
            return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) < beta else (lo, mid)
    return lo


@dataclass(frozen=True)
class OneRunAudit:
    epsilon_lower: float
    canaries: int
    guesses: int
    correct: int
    k_plus: int
    k_minus: int
    confidence: float

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))


def one_run_audit(scores: np.ndarray, included: np.ndarray, delta: float, *, confidence: float = 0.95,
                  guesses: tuple[int, ...] | None = None) -> OneRunAudit:
    """Guess "in" for the k₊ highest and "out" for the k₋ lowest scores (k₊ = k₋ = k), for each k in ``guesses``
    (default: 1%, 2%, 5%, 10%, 20%, 50% of m each side), and report the best bound. Taking the best of several k
    costs a union bound: each k is tested at confidence 1 − β/len(guesses)."""
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = len(scores)
    if m != len(included) or m < 2:
        raise ValidationError("one-run audit needs one score and one inclusion flag per canary (at least 2)")
    ks = guesses or tuple(sorted({max(1, int(f * m)) for f in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)}))
    ks = tuple(k for k in ks if 2 * k <= m) or (m // 2,)
    level = 1 - (1 - confidence) / len(ks)
    order = np.argsort(-scores, kind="stable")
    best = OneRunAudit(0.0, m, 0, 0, 0, 0, confidence)
    for k in ks:
        top, bottom = order[:k], order[m - k:]
        v = int(included[top].sum() + (~included[bottom]).sum())
        eps = one_run_epsilon(m, 2 * k, v, delta, level)
        if eps > best.epsilon_lower or best.guesses == 0:
            best = OneRunAudit(eps, m, 2 * k, v, k, k, confidence)
    return best
