from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

torch.set_num_threads(1)

#: float64's unit roundoff u = 2⁻⁵³
UNIT_ROUNDOFF = 2.0**-53


def rounding_tolerance(*, rounds: int, ops: int, scale: float) -> float:
    """How far apart two float64 evaluations of the same ``rounds``-round recursion may end when they use different
    kernels (a BLAS product against a batched one, one row against many: other vector widths, other summation
    orders) — the bound the tests that compare such paths assert, derived from the operation count, not fitted.

    In one round every entry is computed with at most ``ops`` floating-point operations on values of magnitude at
    most ``scale``; two evaluation orders of such a computation differ by at most ops·u·scale (the standard bound
    γ_ops on sums and products of ops terms, Higham, *Accuracy and Stability*, §3.1). A difference made in round t
    is carried by the state through the rounds left; the recursions compared here do not expand (mixing is
    non-expansive, gradient steps are below 2/L, tracking and dual variables at worst accumulate), so it grows at
    most linearly over at most ``rounds`` rounds: rounds · (rounds · ops · u · scale) in all. Loose by design — a
    wrong draw, key or weight moves a model by η·σ or more, many orders of magnitude above it."""
    return rounds * rounds * ops * UNIT_ROUNDOFF * scale


def watch_privatised(mechanism) -> list[float]:
    """Record the largest |entry| of every value ``mechanism`` privatises from now on (the scale of a run's noisy
    gradients, for :func:`rounding_tolerance`); returns the list it appends to."""
    seen: list[float] = []
    privatize = mechanism.privatize

    def watched(value, access):
        out = privatize(value, access)
        seen.append(float(out.abs().max()))
        return out

    mechanism.privatize = watched
    return seen


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "a9a" / "a9a.gz").is_file():
        pytest.skip(f"shared data not present at {SHARED_DATA} (a9a/MNIST files are never committed)")
    return SHARED_DATA


def draw_batch(task, seed: int = 0, call: int = 1):
    """Every agent's mini-batch of one access, drawn as the engine draws it (keyed per agent)."""
    from privdl.keys import Draws, Keys

    rows = torch.arange(task.n)
    return task.sample(Draws(Keys(seed, task.n), "batch", call, rows.numpy(), rows.numpy()), rows)


def draw_lot(task, rates, seed: int = 0, call: int = 1):
    """Every agent's Poisson lot of one access (batch, mask), as the engine draws it."""
    from privdl.keys import Draws, Keys

    rows = torch.arange(task.n)
    return task.sample_lot(Draws(Keys(seed, task.n), "lot", call, rows.numpy(), rows.numpy()), rows, rates)


def assert_ghost_matches_per_example(task, *, seed: int, rate: float, spread: float, clip):
    """Ghost clipping's clipped lot sums equal the generic per-example path's, at perturbed models on a keyed lot."""
    from privdl.gradients import clipped_example_sum, ghost_clipped_sum, supports_ghost

    assert supports_ghost(task)
    gen = torch.Generator().manual_seed(seed)
    x = task.init_params(gen).expand(task.n, -1).clone() + spread * torch.randn(task.n, task.dim, generator=gen,
                                                                                  dtype=task.dtype)
    batch, mask = draw_lot(task, torch.full((task.n,), rate, dtype=torch.float64), seed=seed)
    expected = clipped_example_sum(task, x, batch, mask, clip)
    assert torch.allclose(ghost_clipped_sum(task, x, batch, mask, clip), expected, atol=1e-10)


def readme_python(after: str) -> str:
    """The first ```python block of README.md after the text ``after`` (examples are tested as printed)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index(after):]
    code = section[section.index("```python") + len("```python"):]
    return code[:code.index("```")]


def run_printed(code: str) -> str:
    """Execute ``code`` and return what it printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    return out.getvalue()


def run_toml(tmp_path, text: str) -> dict:
    """Run the one-run experiment a TOML config text describes, through load_config and the runner; its manifest."""
    import json

    from privdl.experiment import load_config, run_experiment

    (tmp_path / "exp.toml").write_text(text)
    run_experiment(load_config(tmp_path / "exp.toml"), tmp_path / "out", progress=False)
    (path,) = list((tmp_path / "out" / "runs").glob("*/manifest.json"))
    return json.loads(path.read_text())


def run_and_reaccount(tmp_path, text: str) -> tuple[dict, "object", dict]:
    """:func:`run_toml`, then ``privdl account --manifest`` on the run: (manifest, its path, the account's JSON)."""
    import json

    from typer.testing import CliRunner

    from privdl.cli import app

    man = run_toml(tmp_path, text)
    (path,) = list((tmp_path / "out" / "runs").glob("*/manifest.json"))
    res = CliRunner().invoke(app, ["account", "--manifest", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    return man, path, json.loads(res.output)


def in_slices(parts: int, work, transport=None):
    """Run ``work(k, transport)`` for every slice k < ``parts`` in a thread of its own over one in-process transport
    (a new one unless given); a slice's error fails the transport (its peers' waits end). Returns (transport, each
    slice's error or None)."""
    import threading

    from privdl.comm.transport import Transport

    transport = transport or Transport(parts, timeout=20)
    errors = [None] * parts

    def run(k):
        try:
            work(k, transport)
        except BaseException as exc:  # noqa: BLE001 - the caller decides which to raise
            errors[k] = exc
            transport.fail(k, exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return transport, errors


def agree_slices(net, groups, placements, *, entropy=None, transport=None, identities=None, store=None,
                 keep=False, context="test"):
    """Every slice's agreed key source, each agreeing in its own thread over one in-process transport (``identities``:
    one per slice, or one for all); the first error any slice raised is raised."""
    from privdl.keys import RootKeys
    from privdl.agreement import agree
    from privdl.simulator.sliced import owners_of

    n = net.n
    owner = owners_of(placements, n)
    out = [None] * len(placements)
    per_slice = identities if isinstance(identities, (list, tuple)) else [identities] * len(placements)

    def work(k, transport):
        out[k] = agree(part=k, placement=placements[k], owner=owner, network=net, groups=groups,
                       transport=transport, public=RootKeys(1), context=context, entropy=entropy,
                       identities=per_slice[k], store=store, keep=keep)

    _, errors = in_slices(len(placements), work, transport)
    first = next((e for e in errors if e is not None and type(e).__name__ != "TransportError"), None) or \
        next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    assert all(o is not None for o in out)
    return out


def binomial_fit_p_value(sizes, m: int, q: float) -> float:
    """Chi-square goodness of fit of observed sizes to Binomial(m, q): bins merged from the tails inwards until each
    expects at least 5 (the chi-square approximation's usual condition)."""
    import numpy as np
    from scipy import stats

    pmf = stats.binom.pmf(np.arange(m + 1), m, q)
    observed = np.bincount(sizes, minlength=m + 1).astype(float)
    expected = pmf * len(sizes)
    edges, acc = [], 0.0
    for k in range(m + 1):  # cut after k once the bin so far expects ≥ 5 and the rest does too
        acc += expected[k]
        if acc >= 5 and expected[k + 1:].sum() >= 5:
            edges.append(k + 1)
            acc = 0.0
    bins = np.split(np.arange(m + 1), edges)
    obs = np.array([observed[b].sum() for b in bins])
    exp = np.array([expected[b].sum() for b in bins])
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


class Stop(Exception):
    """An interruption after some round (a killed process, as the engine sees it)."""


def stop_after(cut):
    """An ``on_step`` that stops the run after round ``cut``."""
    def on_step(t):
        if t == cut:
            raise Stop
    return on_step


def kill_after_first_checkpoint(cfg, out, procs: int = 2, deadline: float = 120.0) -> None:
    """Start ``privdl run cfg --procs K`` and SIGKILL every process of it once a checkpoint round is complete (a
    ``run.pt`` exists); fails if none was written before the deadline."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "from privdl.cli import main; main()", "run", str(cfg),
                             "--procs", str(procs), "--out", str(out), "--no-plot", "--quiet"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + deadline
    while time.time() < end and not any(Path(out).rglob("run.pt")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any(Path(out).rglob("run.pt")), "no checkpoint was written before the deadline"
