"""Hand-written mutants of privdl's privacy-critical code (issues 16 and 29): does the test suite notice?

Each mutant is one textual change to one source file — σ scaled, clipping skipped or scaled (in the mechanism, in the
engine's data access, in each per-example gradient path), lots drawn at another rate than the ledger states, a wrong
δ, T or access count, a wrong sensitivity, a wrong graph or mixing rule, a calibration allowed to overshoot. The script
copies the tree to a scratch folder — the committed tree (``git worktree``), or with ``--working-tree`` the files of
the working tree (tracked and untracked-but-not-ignored: uncommitted tests and fixes count) — applies one mutant at a
time there, runs every test file that can kill a privacy mutant (:data:`SUITE`) against the mutated source
(``PYTHONPATH``, stop at the first failure) and restores the file. A mutant is **killed** when a test fails,
**survived** when all pass. The report (markdown) lists both; every mutant that changes a privacy guarantee must be
killed.

    python benchmarks/mutation.py [--working-tree] [--only NAME ...] [--report docs/MUTATION.md]

``--report`` replaces the table an existing report ends with and keeps the prose above it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: every test file that can kill a privacy mutant, the fast end-to-end ones first (``-x`` stops at the first failure):
#: the privacy path as it runs (lots, clipping through every consumer), tamper-evident ledgers, the accountants,
#: mechanisms, networks, and the membership audits (a statistical test of the trained models)
SUITE = ["tests/test_privacy_path.py", "tests/test_tamper.py", "tests/test_accountant.py",
         "tests/test_correlated_noise.py", "tests/test_example_dp.py", "tests/test_example_accountant.py",
         "tests/test_ledger.py", "tests/test_network.py", "tests/test_large_network.py",
         "tests/test_per_example_correlated.py", "tests/test_dpdl.py", "tests/test_covariance.py",
         "tests/test_audit.py"]

M = "src/privdl/mechanisms/"
P = "src/privdl/privacy/"
N = "src/privdl/network/"
A = "src/privdl/simulator/access.py"
#: (name, file, original text, mutated text, what it breaks)
MUTANTS: list[tuple[str, str, str, str, str]] = [
    ("correlated_noise_halved", M + "correlated.py",
     "out = flat + self.noise.network(access.call, flat.shape[1], flat.dtype).to(flat.device)",
     "out = flat + 0.5 * self.noise.network(access.call, flat.shape[1], flat.dtype).to(flat.device)",
     "σ scaled: correlated / LDP noise at half its std"),
    ("batch_clip_skipped", M + "correlated.py",
     "g = clip_rows(value, self.clip) if self.clip and self.batch is None else value", "g = value",
     "clip skipped: agent-level gradients not clipped"),
    ("clip_scaled", M + "base.py", "torch.clamp(clip / norms", "torch.clamp(2 * clip / norms",
     "clip scaled: rows clipped to 2C"),
    ("agent_sensitivity_C", M + "correlated.py", 'return Sensitivity(2 * self.clip, "agent")',
     'return Sensitivity(self.clip, "agent")', "wrong sensitivity: C instead of 2C (replace one agent)"),
    ("example_sensitivity_uniform", M + "correlated.py",
     'self.clip if self.sampling == "poisson" else 2 * self.clip', "self.clip",
     "wrong sensitivity: replace-one example accounted as add/remove"),
    ("dp_sgd_noise_halved", M + "dp_sgd.py", "((flat + scale * noise) / self.lot_size)",
     "((flat + 0.5 * scale * noise) / self.lot_size)", "σ scaled: DP-SGD noise at half its std"),
    ("dp_sgd_clip_skipped", A, "        clip = need.clip\n", "        clip = None\n",
     "clip skipped: the engine passes no clip to DP-SGD's per-example path (the ledger still says C)"),
    ("closed_form_clip_skipped", "src/privdl/tasks/supervised.py",
     "        if clip is not None:\n            sq = (r * r)", "        if False:\n            sq = (r * r)",
     "clip skipped in the closed-form clipped sum (linear models)"),
    ("ghost_clip_skipped", "src/privdl/gradients/ghost.py", "    if clip is None:\n        weight = mask",
     "    if True:\n        weight = mask", "clip skipped in ghost clipping"),
    ("vmap_clip_skipped", "src/privdl/gradients/functional.py",
     "        if clip is not None:\n            sq = sum(", "        if False:\n            sq = sum(",
     "clip skipped in the torch.func per-example path"),
    ("lots_at_2q", A, "row_rates = rates.index_select(0, owners % rates.numel())",
     "row_rates = 2 * rates.index_select(0, owners % rates.numel())",
     "lots drawn at 2q by the engine while the ledger says q"),
    ("lot_rate_of_requester", A, "row_rates = rates.index_select(0, owners % rates.numel())",
     "row_rates = rates.index_select(0, requesters % rates.numel())",
     "a cross-gradient's lot drawn at the requester's rate, not the data owner's"),
    ("dp_sgd_need_rates_doubled", M + "dp_sgd.py", "else self.clip, self.rates, per_example, chunk)",
     "else self.clip, 2 * self.rates, per_example, chunk)",
     "DP-SGD asks the engine for lots at 2q while its events say q"),
    ("lot_inclusion_doubled", "src/privdl/tasks/base.py", "include = (u < rates.to(torch.float64)",
     "include = (u < 2 * rates.to(torch.float64)", "Poisson lots: examples join at twice the rate"),
    ("dp_sgd_rate_halved", M + "dp_sgd.py", "sample_rate=float(q))\n", "sample_rate=float(q) / 2)\n",
     "wrong sampling rate in the ledger"),
    ("dp_sgd_steps_halved", M + "dp_sgd.py", "calibrate_noise_multiplier(epsilon=epsilon, sample_rate=q, steps=t,",
     "calibrate_noise_multiplier(epsilon=epsilon, sample_rate=q, steps=max(t // 2, 1),",
     "wrong T: DP-SGD calibrated for half the accesses"),
    ("correlated_event_precision", M + "correlated.py",
     "GaussianEvent(precision=float(m), sensitivity=sens.value)",
     "GaussianEvent(precision=float(m) / 2, sensitivity=sens.value)", "ledger precision halved"),
    ("tamper_check_off", P + "verify.py", "    if mismatches:\n        raise LedgerMismatch(mismatches)",
     "    if False:\n        raise LedgerMismatch(mismatches)",
     "tamper evidence off: a hand-edited ledger re-accounts to a quiet new ε"),
    ("zcdp_conversion", P + "agent_accountant.py", "return rho + 2 * math.sqrt(rho * math.log(1.0 / delta))",
     "return rho + math.sqrt(rho * math.log(1.0 / delta))", "wrong ε formula (paper accountant)"),
    ("paper_steps", P + "agent_accountant.py", "rho=2 * clip**2 * steps * bound",
     "rho=2 * clip**2 * max(steps - 1, 1) * bound", "wrong T in the paper accountant"),
    ("gdp_mu", P + "agent_accountant.py", "return 2.0 * clip * math.sqrt(steps * bound)",
     "return clip * math.sqrt(steps * bound)", "wrong sensitivity in the tight accountant"),
    ("calibration_overshoot", P + "agent_accountant.py",
     "    while acc.epsilon(bound=b, delta=delta, clip=clip, steps=steps) > epsilon:\n        b *= 1 - 1e-12",
     "    while False:\n        b *= 1 - 1e-12", "calibration may overshoot its target ε"),
    ("rdp_wrong_delta", P + "example_accountant.py",
     "eps, order = accountant.get_epsilon_and_optimal_order(delta)",
     "eps, order = accountant.get_epsilon_and_optimal_order(min(10 * delta, 0.5))", "wrong δ (example RDP)"),
    ("rdp_overshoot_guard", P + "example_accountant.py",
     "while _rdp(sigma, sample_rate, steps, delta, orders)[0] > epsilon:", "while False:",
     "example calibration may overshoot"),
    ("ldp_variance", "src/privdl/covariance/designs.py",
     'finish_design("ldp", w, np.eye(n) / b, b, sigma_mix2=1.0 / b, components=[])',
     'finish_design("ldp", w, np.eye(n) / (2 * b), b, sigma_mix2=1.0 / (2 * b), components=[])',
     "σ scaled: LDP design variance halved"),
    ("dpdl_accesses", "src/privdl/algorithms/dpdl.py",
     "return edges.degree.to(torch.int64) * iterations + (iterations if self_noise else 0)",
     "return edges.degree.to(torch.int64) * iterations", "wrong access count: self-gradients not counted"),
    ("per_round_accesses", "src/privdl/algorithms/base.py",
     "torch.full((edges.rows,), rounds_factor * iterations + extra, dtype=torch.int64)",
     "torch.full((edges.rows,), iterations, dtype=torch.int64)", "wrong access count: extra accesses dropped"),
    ("star_is_complete", N + "topology.py", "return nx.star_graph(n - 1)", "return nx.complete_graph(n)",
     "wrong graph: star → complete"),
    ("ring_is_path", N + "topology.py", "return nx.cycle_graph(n)", "return nx.path_graph(n)",
     "wrong graph: ring → path"),
    ("mh_min_degree", N + "mixing.py", "np.maximum(deg[:, None], deg[None, :])",
     "np.minimum(deg[:, None], deg[None, :])", "wrong mixing rule (Metropolis–Hastings with min)"),
    ("sparse_mh_min_degree", N + "sparse.py", "np.maximum(deg[rows], deg[cols])", "np.minimum(deg[rows], deg[cols])",
     "wrong sparse mixing rule"),
    ("sparse_ring_is_path", N + "sparse.py", "return i, (i + 1) % n", "return i[:-1], i[1:]",
     "wrong graph: sparse ring → path"),
]


def copy_working_tree(tree: Path) -> None:
    """Copy the files git would see in the working tree — tracked (as they are now, edits included) and untracked but
    not ignored — to ``tree``; tracked files deleted in the working tree are left out."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / rel)


def write_report(path: Path, table: str) -> None:
    """The table into ``path``: in place of the table an existing report ends with (its prose is kept), or alone."""
    text = path.read_text() if path.is_file() else ""
    head = text[:text.index("| mutant |")] if "| mutant |" in text else ""
    path.write_text(head + table + "\n")


def run_suite(tree: Path, timeout: int) -> tuple[bool, str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *SUITE],
                             cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, "timeout", time.perf_counter() - t
    failed = next((ln.split(" ")[1] for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    return out.returncode != 0, failed, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--report", default=None)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--working-tree", action="store_true",
                    help="mutate a copy of the working tree (tracked and untracked-but-not-ignored files, as they "
                         "are now) instead of the committed tree")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="privdl-mutants-"))
    tree = scratch / "tree"
    if args.working_tree:
        copy_working_tree(tree)
    else:
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), "HEAD"], cwd=ROOT, check=True,
                       capture_output=True)
    if (ROOT.parent / "shared").exists() and not (scratch / "shared").exists():
        (scratch / "shared").symlink_to(ROOT.parent / "shared")  # tests look for ../shared/data
    rows = []
    try:
        probe = subprocess.run([sys.executable, "-c", "import privdl; print(privdl.__file__)"], cwd=tree,
                               env={**os.environ, "PYTHONPATH": str(tree / "src")}, capture_output=True, text=True)
        assert str(tree) in probe.stdout, f"the mutated tree is not the one imported: {probe.stdout}"
        clean, failed, secs = run_suite(tree, args.timeout)
        if clean:
            raise SystemExit(f"the unmutated suite fails ({failed}): fix it first")
        print(f"unmutated suite passes in {secs:.0f} s", flush=True)
        for name, rel, old, new, what in MUTANTS:
            if args.only and name not in args.only:
                continue
            path = tree / rel
            text = path.read_text()
            if text.count(old) != 1:
                rows.append((name, what, "NOT APPLIED (text not found once)", "", 0.0))
                print(f"{name}: not applied", flush=True)
                continue
            path.write_text(text.replace(old, new))
            try:
                killed, failed, secs = run_suite(tree, args.timeout)
            finally:
                path.write_text(text)
            rows.append((name, what, "killed" if killed else "SURVIVED", failed, secs))
            print(f"{name}: {'killed by ' + failed if killed else 'SURVIVED'} ({secs:.0f} s)", flush=True)
    finally:
        if not args.working_tree:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    lines = ["| mutant | what it breaks | result | first failing test | seconds |", "|---|---|---|---|---|"]
    lines += [f"| `{n}` | {w} | {r} | `{f}` | {s:.0f} |" if f else f"| `{n}` | {w} | {r} | | {s:.0f} |"
              for n, w, r, f, s in rows]
    table = "\n".join(lines)
    print(table)
    if args.report:
        write_report(Path(args.report), table)
    survived = [r[0] for r in rows if r[2] != "killed"]
    print(f"{len(rows) - len(survived)}/{len(rows)} killed" + (f"; not killed: {', '.join(survived)}" if survived
                                                                  else ""))


if __name__ == "__main__":
    main()
