"""PLD against RDP for example-level DP (issue 34, part 3): how much noise each accountant's calibration asks for and
how long it takes, at the configurations privdl calibrates most — seed 004's (q = 256/6000, T = 2000 noisy accesses,
δ = 1e-5, ε ∈ {0.5, 1, 10, 100}) and the DPDL benchmark's (lots of 64, 1000 rounds on a ring of 10: T = 2 × 1000
cross-gradients per owner, 3000 with self-noise; MNIST digits' 800 examples per agent, q = 0.08, and Fashion-MNIST's
6000, q = 64/6000; δ = 1e-5, ε ∈ {1, 3, 10}).

Per row: σ calibrated with RDP and with PLD (each never overshoots its own accountant), the PLD ε of the RDP σ (the
same noise, accounted tighter), and each calibration's wall time from cold caches (the best of ``--repeat``; one
calibration runs per distinct (q, T) of a run's agents, once per process). The last line: the PLD/RDP ε ratio over
the tests' grid σ ∈ {0.8, 1.5, 5}, q ∈ {0.01, 0.1, 1}, T ∈ {1, 100, 1000}.

    python benchmarks/bench_pld.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import time

from privdl.privacy import example_accountant as ea

SEED004_Q = 256 / 6000
CONFIGS = [
    ("seed 004 (q = 256/6000, T = 2000)", SEED004_Q, 2000, (0.5, 1.0, 10.0, 100.0)),
    ("DPDL MNIST ring (q = 0.08, T = 2000)", 0.08, 2000, (1.0, 3.0, 10.0)),
    ("DPDL MNIST ring, self-noise (q = 0.08, T = 3000)", 0.08, 3000, (1.0, 3.0, 10.0)),
    ("DPDL Fashion-MNIST ring (q = 64/6000, T = 2000)", 64 / 6000, 2000, (1.0, 3.0, 10.0)),
]
DELTA = 1e-5


def cold() -> None:
    """Empty every accounting cache, so each calibration is timed from scratch."""
    for f in (ea._rdp, ea._calibrate, ea._pld_of, ea._scale, ea._calibrate_pld):
        f.cache_clear()


def calibrate(accountant: str, eps: float, q: float, steps: int, repeat: int) -> tuple[float, float]:
    best, sigma = float("inf"), 0.0
    for _ in range(repeat):
        cold()
        t0 = time.perf_counter()
        sigma = ea.calibrate_noise_multiplier(epsilon=eps, sample_rate=q, steps=steps, delta=DELTA,
                                              accountant=accountant)
        best = min(best, time.perf_counter() - t0)
    return sigma, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print("| config | ε target | σ_rdp | σ_pld | σ_pld/σ_rdp | ε_pld at σ_rdp | calibration rdp | pld | pld/rdp |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst_time, ratios, times = 0.0, [], []
    for label, q, steps, epsilons in CONFIGS:
        for eps in epsilons:
            s_rdp, t_rdp = calibrate("rdp", eps, q, steps, args.repeat)
            s_pld, t_pld = calibrate("pld", eps, q, steps, args.repeat)
            assert ea.pld_epsilon(noise_multiplier=s_pld, sample_rate=q, steps=steps, delta=DELTA)[0] <= eps
            assert ea.rdp_epsilon(noise_multiplier=s_rdp, sample_rate=q, steps=steps, delta=DELTA)[0] <= eps
            e_pld = ea.pld_epsilon(noise_multiplier=s_rdp, sample_rate=q, steps=steps, delta=DELTA)[0]
            worst_time = max(worst_time, t_pld)
            ratios.append(s_pld / s_rdp)
            times.append(t_pld / t_rdp)
            print(f"| {label} | {eps:g} | {s_rdp:.4f} | {s_pld:.4f} | {s_pld / s_rdp:.3f} | {e_pld:.4g} "
                  f"({e_pld / eps:.3f} ε) | {t_rdp:.2f} s | {t_pld:.2f} s | {t_pld / t_rdp:.2f} |", flush=True)
    grid = [ea.pld_epsilon(noise_multiplier=s, sample_rate=q, steps=t, delta=DELTA)[0]
            / ea.rdp_epsilon(noise_multiplier=s, sample_rate=q, steps=t, delta=DELTA)[0]
            for s in (0.8, 1.5, 5.0) for q in (0.01, 0.1, 1.0) for t in (1, 100, 1000)]
    print(f"\nσ_pld/σ_rdp {min(ratios):.3f}–{max(ratios):.3f}; PLD calibration {min(times):.2f}–{max(times):.2f}× "
          f"RDP's, slowest {worst_time:.2f} s; ε_pld/ε_rdp over the tests' grid (27 points) "
          f"{min(grid):.3f}–{max(grid):.3f}")


if __name__ == "__main__":
    main()
