"""Hand-written mutants of privdl's privacy-critical code (issues 16, 29 and 43): does the test suite notice?

Each mutant is one textual change to one source file — σ scaled, clipping skipped or scaled (in the mechanism, in the
engine's data access, in each per-example gradient path), lots drawn at another rate than the ledger states (or the
whole data, a fixed prefix, a clamped rate at q ≥ 0.5), a σ looked up by requester instead of data owner, Zip-DL
calibrated on incoming instead of outgoing edges, a wrong δ, T or access count, a wrong sensitivity, a wrong graph or
mixing rule, a calibration allowed to overshoot. The script
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
#: the mechanisms' properties (issue 43: the owner's σ, Zip-DL's outgoing edges, Poisson lots at high rates), the
#: privacy path as it runs (lots, clipping through every consumer), tamper-evident ledgers, the accountants,
#: mechanisms, networks, and the membership audits (a statistical test of the trained models)
SUITE = ["tests/test_mechanism_properties.py", "tests/test_privacy_path.py", "tests/test_tamper.py",
         "tests/test_accountant.py", "tests/test_correlated_noise.py", "tests/test_example_dp.py",
         "tests/test_example_accountant.py", "tests/test_ledger.py", "tests/test_network.py",
         "tests/test_large_network.py", "tests/test_per_example_correlated.py", "tests/test_dpdl.py",
         "tests/test_covariance.py", "tests/test_audit.py"]
#: the tests of the agreed-key path (issue 43), run first for a mutant of :data:`KEY_FILES` and after :data:`SUITE`
#: for the others
KEY_SUITE = ["tests/test_agreed_keys.py", "tests/test_identity.py", "tests/test_agreed_resume.py",
             "tests/test_agreement.py", "tests/test_checkpoint.py"]
KEY_FILES = ("src/privdl/keys.py", "src/privdl/agreement/", "src/privdl/runtime/", "src/privdl/simulator/engine.py",
             "src/privdl/simulator/checkpoint.py", "src/privdl/simulator/sliced.py",
             "src/privdl/simulator/coordinator.py", "src/privdl/experiment/runner.py",
             "src/privdl/experiment/backends.py", "src/privdl/experiment/run_plan.py",
             "src/privdl/experiment/run_pipeline.py", "src/privdl/experiment/run_state.py",
             "src/privdl/experiment/run_manifest.py", "src/privdl/experiment/loop_steps.py")

M = "src/privdl/mechanisms/"
P = "src/privdl/privacy/"
N = "src/privdl/network/"
A = "src/privdl/simulator/access.py"
T = "src/privdl/tasks/base.py"
Z = M + "zip_dl.py"
#: the agreed-key path (issue 43): keys, agreement, identities, stored secrets, checkpoints, the backends' key setup
K = "src/privdl/keys.py"
AG = "src/privdl/agreement/__init__.py"
ID = "src/privdl/agreement/identity.py"
KS = "src/privdl/agreement/keystore.py"
EN = "src/privdl/simulator/engine.py"
RP = "src/privdl/experiment/run_plan.py"
BE = "src/privdl/experiment/backends.py"
SL = "src/privdl/simulator/sliced.py"
WK = "src/privdl/runtime/worker.py"
#: (name, file, original text, mutated text, what it breaks)
MUTANTS: list[tuple[str, str, str, str, str]] = [
    ("correlated_noise_halved", M + "correlated.py",
     "out = flat + drawn.to(flat.device)", "out = flat + 0.5 * drawn.to(flat.device)",
     "σ scaled: correlated / LDP noise at half its std"),
    ("batch_clip_skipped", M + "correlated.py",
     "g = clip_rows(value, self.clip) if self.clip and self.batch is None else value", "g = value",
     "clip skipped: agent-level gradients not clipped"),
    ("clip_scaled", M + "base.py", "torch.clamp(clip / norms", "torch.clamp(2 * clip / norms",
     "clip scaled: rows clipped to 2C"),
    ("budget_repeat_unchecked", M + "base.py",
     "repeat[0] is access.owners and getattr(self, \"_headroom\", 0) >= repeat[2]:",
     "repeat[0] is access.owners:",
     "budget skipped: a held frame's repeated access counted past the accounting"),
    ("budget_everyone_unchecked", M + "base.py",
     "if access.everyone and getattr(self, \"_headroom\", 0) >= 1:", "if access.everyone:",
     "budget skipped: an access of every row counted past the accounting"),
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
    ("lot_inclusion_doubled", T, "return (u < rates.to(torch.float64)",
     "return (u < 2 * rates.to(torch.float64)", "Poisson lots: examples join at twice the rate"),
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
    # ---- issue 43, finding 7: the property each breaks is tested in tests/test_mechanism_properties.py ----------
    # DP-SGD's σ is the data owner's (per-owner σ; DPDL's cross-gradients have owner ≠ requester)
    ("dp_sgd_sigma_of_requester", M + "dp_sgd.py",
     "scale = self._scales[key].index_select(0, (owners % self.sigmas.numel())",
     "scale = self._scales[key].index_select(0, (access.requesters.cpu() % self.sigmas.numel())",
     "DP-SGD: a cross-gradient gets the requester's σ, not the data owner's"),
    ("stacked_sigma_of_requester", M + "stack.py", "scale, lot = self._per_row(flat, owners)",
     "scale, lot = self._per_row(flat, access.requesters.cpu())",
     "stacked DP-SGD: a cross-gradient gets the requester's σ (and lot size), not the data owner's"),
    ("access_owner_requester_swapped", A,
     "access = Access(owners=owners, requesters=requesters, call=self.calls, everyone=everyone, t=self.t)",
     "access = Access(owners=requesters, requesters=owners, call=self.calls, everyone=everyone, t=self.t)",
     "the engine tells the mechanism the requester as owner: σ (and the budget charged) of the wrong agent"),
    # Zip-DL calibrates each sender on its outgoing edges (what it sends)
    ("zip_dl_worst_over_incoming", Z, 'np.minimum.at(self.c_worst, self.src, self.plan["c_edge"])',
     'np.minimum.at(self.c_worst, self.dst, self.plan["c_edge"])',
     "Zip-DL: each agent's worst neighbour taken over its incoming edges (calibration and ledger)"),
    ("zip_dl_c_of_receiver", Z, "c_edge = base[src] + (sumsq[src] - w_edge**2) / (d[src] * w_edge) ** 2",
     "c_edge = base[dst] + (sumsq[dst] - w_edge**2) / (d[dst] * w_edge) ** 2",
     "Zip-DL: Lemma 3.3's coefficient of a → v from the receiver's neighbourhood (= c_{v→a})"),
    ("zip_dl_correction_of_receiver", Z, '"inv_edge": 1.0 / (d[src] * w_edge)', '"inv_edge": 1.0 / (d[dst] * w_edge)',
     "Zip-DL: the zero-sum correction of a → v divides by the receiver's d_v"),
    ("zip_dl_scale_of_receiver", Z, "return z_edge * scale[rows][:, None], z_self * scale[:, None]",
     "return z_edge * scale[dst.cpu()][:, None], z_self * scale[:, None]",
     "Zip-DL: the message a → v scaled by the receiver's ς_v"),
    # Poisson lots at every rate, with the ledger's q
    ("lots_whole_at_half", T, "if bool((rates >= 1).all()):", "if bool((rates >= 0.5).all()):",
     "the whole data when every rate is ≥ 0.5 while the ledger states q"),
    ("lots_whole_if_any_whole", T, "if bool((rates >= 1).all()):", "if bool((rates >= 1).any()):",
     "mixed rates: every owner's whole data as soon as one owner has q = 1"),
    ("lot_whole_when_every_rate_high", T, "include, size = self._lot_positions(draws, counts, rates)",
     "include, size = (None, int(counts.max())) if bool((rates >= 0.5).all()) else "
     "self._lot_positions(draws, counts, rates)",
     "sample_lot takes the whole data when every rate is ≥ 0.5"),
    ("lot_rates_clamped", T, "return (u < rates.to(torch.float64).cpu()[:, None])",
     "return (u < rates.to(torch.float64).clamp(max=0.5).cpu()[:, None])",
     "Poisson lots at a rate clamped to 0.5 while the ledger states q"),
    ("lot_fixed_prefix", T, "return (u < rates.to(torch.float64).cpu()[:, None])",
     "return (pos < rates.to(torch.float64).cpu()[:, None] * counts[:, None])",
     "a fixed lot: the first ⌈q·m⌉ examples every time (the mean right, no sampling)"),
    ("engine_high_rates_rounded_up", A, "row_rates = rates.index_select(0, owners % rates.numel())",
     "row_rates = torch.where(rates >= 0.5, torch.ones_like(rates), rates).index_select(0, owners % rates.numel())",
     "the engine draws the whole data for owners with q ≥ 0.5"),
    ("sliced_high_rates_rounded_up", A, "rates.index_select(0, o % rates.numel()),",
     "torch.where(rates >= 0.5, torch.ones_like(rates), rates).index_select(0, o % rates.numel()),",
     "a slice draws the whole data for owners with q ≥ 0.5 (sliced backend, runtime workers)"),
    ("dp_sgd_need_rates_clamped", M + "dp_sgd.py", "else self.clip, self.rates, per_example, chunk)",
     "else self.clip, self.rates.clamp(max=0.5), per_example, chunk)",
     "DP-SGD asks the engine for lots at min(q, 0.5) while its events say q"),
    ("dp_sgd_rates_clamped", M + "dp_sgd.py", "self.rates = lot_size / m if sample_rate is None",
     "self.rates = (lot_size / m).clamp(max=0.5) if sample_rate is None",
     "DP-SGD's rates clamped to 0.5: lots and ledger at 0.5 where the config gives q = L/m"),
    # ---- issue 43, the agreed-key path: tests/test_agreed_keys.py, test_agreed_resume.py, test_identity.py --------
    ("keys_fold_ignores_counter", K,
     'h.update(value.to_bytes(8, "little"))',
     'h.update(b"")',
     "agreed keys: the fold ignores the counter (the same noise every round; two messages' difference removes it)"),
    ("keys_chacha_block_counter_dropped", K, 'nonce = first.to_bytes(4, "little") + bytes(12)', "nonce = bytes(16)",
     "agreed keys: ChaCha20's block counter dropped (an offset draw repeats the first block)"),
    ("keys_stream_key_truncated", K, "cipher = Cipher(algorithms.ChaCha20(k[i].tobytes(), nonce), mode=None)",
     "cipher = Cipher(algorithms.ChaCha20(k[i].tobytes()[:8] + bytes(24), nonce), mode=None)",
     "agreed keys: draws keyed by 64 of the key's 256 bits"),
    ("agreed_key_64_bits", AG, "        return key256(key)\n",
     "        return key256(key[:8] + bytes(24))\n", "agreed keys: draw keys folded to 64 bits (zero-padded)"),
    ("agreed_own_purpose_dropped", AG, 'base[i] = self._key(secret, f"privdl/v1/own/{purpose}/{i}")',
     'base[i] = self._key(secret, f"privdl/v1/own/{i}")',
     "agreed keys: the purpose dropped from an agent's own keys (lots and noise from one keystream)"),
    ("agreed_shared_purpose_dropped", AG,
     "return self._key(secret, f\"privdl/v1/shared/{purpose}/{'-'.join(map(str, members))}\")",
     "return self._key(secret, f\"privdl/v1/shared/{'-'.join(map(str, members))}\")",
     "agreed keys: the purpose dropped from shared keys"),
    ("agreed_own_from_salt", AG, 'base[i] = self._key(secret, f"privdl/v1/own/{purpose}/{i}")',
     'base[i] = self._key(self.salt, f"privdl/v1/own/{purpose}/{i}")',
     "agreed keys: own draw keys derived from the public salt"),
    ("agreed_shared_from_salt", AG,
     "return self._key(secret, f\"privdl/v1/shared/{purpose}/{'-'.join(map(str, members))}\")",
     "return self._key(self.salt, f\"privdl/v1/shared/{purpose}/{'-'.join(map(str, members))}\")",
     "agreed keys: shared draw keys derived from the public salt"),
    ("agreed_fixed_nonce", AG, "nonce = draw(f\"nonce/{'-'.join(map(str, g))}/{m}\")[:NONCE]", "nonce = bytes(NONCE)",
     "agreed keys: a fixed AEAD nonce for every wrapped group secret"),
    ("agreed_raw_x25519", AG, "shared[(a, b)] = pair_secret(raw, salt, a, b, known[a], known[b])",
     "shared[(a, b)] = raw", "agreed keys: the raw X25519 output used as the pair secret"),
    ("agreed_no_transcript", AG, 'return _hkdf(raw, salt, f"privdl/v1/pair/{a}-{b}".encode() + b"\\x1f" + public_a + public_b)',
     'return _hkdf(raw, salt, f"privdl/v1/pair/{a}-{b}".encode())',
     "agreed keys: the pair secret not bound to the public keys"),
    ("agreed_wrap_is_pair", AG, 'return _hkdf(pair, salt, f"privdl/v1/wrap/{min(a, b)}-{max(a, b)}")', "return pair",
     "agreed keys: group secrets wrapped under the pair secret itself"),
    ("agreed_simulator_root_keys", BE,
     "keys, restored, setup = Keys(source, c.network.n), source.restored, time.perf_counter() - began",
     "keys, restored, setup = Keys(RootKeys(int(cfg['seed'])), c.network.n), source.restored, time.perf_counter() - began",
     "agreed keys switched off in the simulator's runner (root-key SplitMix64 draws)"),
    ("agreed_sliced_root_keys", SL, "keys = Keys(mine if sources is not None and not agreed else HeldKeys(mine, p.held), n)",
     "keys = Keys(mine if sources is not None and not agreed else HeldKeys(source, p.held), n)",
     "agreed keys switched off in the sliced backend's slices"),
    ("agreed_runs_stacked", RP, '''            or runtime.keys != "root"):''',
     '''            or False):''', "agreed runs of a sweep planned on one replica axis (root keys)"),
    ("resume_reagrees", AG, "            return AgreedKeys.restore(stored, public=public, salt=salt, n=n)\n",
     "            pass\n", "a run started again agrees new keys (re-releases its rounds with new noise)"),
    ("runner_no_store", BE, "context=spec.run_id, store=secrets, store_identity=store_identity,\n"
     "                                 **config_options(cfg, c.network.n, range(c.network.n)))\n"
     "            keys, restored",
     "context=spec.run_id, store=None, store_identity=store_identity,\n"
     "                                 **config_options(cfg, c.network.n, range(c.network.n)))\n"
     "            keys, restored",
     "the simulator's runner keeps no secrets (a restart agrees anew)"),
    ("secrets_other_run_accepted", KS, '            if data["salt"] != self.salt.hex():', "            if False:",
     "a secrets file of another run accepted"),
    ("checkpoint_counts_unchecked", EN, "edges_dst=comm.edges.dst, expected_calls=expected)",
     "edges_dst=comm.edges.dst, expected_calls=None)", "a checkpoint's access counts not checked against its round"),
    ("checkpoint_hmac_off", EN, "checkpoints.authenticate(checkpoint_macs(keys, checkpoints.agents))",
     "checkpoints.authenticate(None)", "agreed checkpoints not sealed with the agents' HMAC"),
    ("identity_not_verified", AG, "                if identities is not None:\n                    identities.verify(",
     "                if False:\n                    identities.verify(", "announced keys not checked against the roster"),
    ("identity_signer_unchecked", ID, "        if signer != want:", "        if False:",
     "a key signed by another identity than the roster's accepted"),
    ("identity_no_salt", ID, 'return b"privdl/v1/x25519-announce\\x1f" + salt + int(agent).to_bytes(8, "little") + x25519_public',
     'return b"privdl/v1/x25519-announce\\x1f" + int(agent).to_bytes(8, "little") + x25519_public',
     "signatures not bound to the run (another run's signed key replays)"),
    ("identity_permissions_unchecked", ID, "            if mode & (stat.S_IRWXG | stat.S_IRWXO):",
     "            if False:", "private identity files others may read accepted"),
    ("agreed_dist_root_keys", WK, "source = root if not agreed else agree(", "source = root if True else agree(",
     "agreed keys switched off in the distributed runtime's workers"),
    ("agreed_dist_no_store", WK, "context=spec.run_id, store=secrets, store_identity=secrets_identity,",
     "context=spec.run_id, store=None, store_identity=secrets_identity,",
     "the distributed runtime keeps no secrets (a resume agrees anew)"),
    # found by a review of the first 26 (each survived the tests then; each is killed now)
    ("keys_vector_counter_dropped", K,
     "counters = np.tile(np.arange(first, first + blocks, dtype=np.uint64), len(k))",
     "counters = np.tile(np.arange(0, blocks, dtype=np.uint64), len(k))",
     "agreed keys: the vectorised ChaCha20 restarts every offset draw at block 0"),
    ("checkpoint_hmac_not_in_slices", EN, 'sources = [getattr(s, "source", s) for s in keys.sources]',
     "sources = list(keys.sources)", "sliced and distributed agreed checkpoints fall back to SHA-256 (no HMAC)"),
    ("agreed_binds_one_public_key", AG, '"privdl/v1/pair/{a}-{b}".encode() + b"\\x1f" + public_a + public_b)',
     '"privdl/v1/pair/{a}-{b}".encode() + b"\\x1f" + public_a)',
     "agreed keys: the pair secret bound to the lower agent's public key only"),
    ("agreed_salt_without_w", AG, "    for t in (e.src, e.dst, e.weight, e.self_weight):\n        a = t.detach()",
     "    for t in ():\n        a = t.detach()", "agreed keys: the salt does not name W"),
    ("agreed_single_is_own", AG, 'return self._key(self._own[i], f"privdl/v1/single/{purpose}/{i}")',
     'return self._key(self._own[i], f"privdl/v1/own/{purpose}/{i}")',
     "agreed keys: a single holder's shared key is its own key (no domain separation)"),
    ("secrets_crash_while_renaming_refused", AG, "    if not anyone_final or not anyone_lost:",
     "    if not anyone_final:", "a setup stopped while renaming its secret files is refused (nothing was released)"),
    ("secrets_lost_agreed_anew", AG, "    if not anyone_final or not anyone_lost:", "    if True:",
     "secrets lost after rounds were released: the run agrees anew (releases them again with new noise)"),
    ("secrets_other_code_accepted", KS, "            if diff:", "            if False:",
     "secrets written under other privdl code or inputs replayed (same noise on other values)"),
    ("secrets_readable_accepted", KS, "        if mode & (stat.S_IRWXG | stat.S_IRWXO):", "        if False:",
     "secret files others may read accepted"),
    ("roster_shared_identity_accepted", ID, "            if raw in self.owner_of:", "            if False:",
     "a roster giving two agents one identity accepted"),
]


def stale(root: Path = ROOT) -> list[str]:
    """The mutants whose ``old`` text is not found exactly once in its file under ``root`` (code moved or edited:
    the mutant would not be applied). ``tests/test_mutation_texts.py`` keeps this empty."""
    out = []
    for name, rel, old, _, _ in MUTANTS:
        path = root / rel
        count = path.read_text().count(old) if path.is_file() else 0
        if count != 1:
            out.append(f"{name}: {rel} holds its text {count} times")
    return out


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


def suite_for(rel: str | None) -> list[str]:
    """The test files for a mutant of ``rel`` (None: the unmutated tree), those most likely to kill it first."""
    if rel is not None and rel.startswith(KEY_FILES):
        return KEY_SUITE + SUITE
    return SUITE + KEY_SUITE


def run_suite(tree: Path, timeout: int, rel: str | None = None) -> tuple[bool, str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                              *suite_for(rel)],
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
                killed, failed, secs = run_suite(tree, args.timeout, rel)
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
