"""Turn one effective run config into the objects the simulator needs (network, task, algorithm, ...)."""

from __future__ import annotations

import contextlib
import hashlib
import warnings
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import torch

from privdl.algorithms import Algorithm, make_algorithm
from privdl.algorithms.base import check_combination, check_directed
from privdl.comm import Comm, make_comm
from privdl.errors import DataError, FileError, ValidationError
from privdl.mechanisms import MECHANISMS, GradientMechanism, make_mechanism
from privdl.network import Network, load_network_file
from privdl.network.directed import build_directed, wants_directed
from privdl.schedules import Schedule, make_schedule
from privdl.tasks import Task, make_task

DTYPES = {"float32": torch.float32, "float64": torch.float64}
T = TypeVar("T")


@dataclass
class Components:
    network: Network
    task: Task
    algorithm: Algorithm
    mechanism: GradientMechanism
    schedule: Schedule
    sparse: bool | None

    def comm(self) -> Comm:
        return make_comm(self.network, sparse=self.sparse)


def _rest(table: dict, *drop: str) -> dict:
    return {k: v for k, v in table.items() if k not in drop}


def resolve_path(value: str, base_dir: str | None, what: str) -> tuple[str, str]:
    """A config path made absolute against ``base_dir`` (the config file's folder) when relative, and a phrase
    saying how it was resolved (for error messages)."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p), ""
    if base_dir:
        return str(Path(base_dir) / p), f" ({what} {value!r} is resolved against the config file's folder {base_dir})"
    return str(p.resolve()), f" ({what} {value!r} is resolved against the current folder {Path.cwd()})"


#: config keys whose value names an input file that changes what a run computes (a W matrix, a covariance file)
INPUT_FILE_KEYS = (("network", "file"), ("mechanism", "file"))
_DIGESTS: dict[tuple[str, int, int], str] = {}


def input_files(cfg: dict) -> dict[str, str]:
    """The sha256 of each input file a run config names (``network.file``, ``mechanism.file``), by dotted key. A run's
    id names such a file by its path (relative to the config's folder), not by what it holds: the manifest records the
    digest, and a finished run is reused only while the file still holds the same bytes. Absent files are left out
    (building the run reports them)."""
    out = {}
    graphs = (cfg.get("network") or {}).get("graphs")  # a cycle's graph files ([network] dynamics = "cycle")
    named = [*INPUT_FILE_KEYS, *((("network", "graphs", k) for k in range(len(graphs)))
                                 if isinstance(graphs, list) else ())]
    for section, key, *at in named:
        value = (cfg.get(section) or {}).get(key)
        value = value[at[0]] if at and isinstance(value, list) else value
        if at:
            key = f"{key}[{at[0]}]"
        if not isinstance(value, str) or not value:
            continue
        path = Path(resolve_path(value, cfg.get("base_dir"), f"{section}.{key}")[0])
        try:
            st = path.stat()
        except OSError:
            continue
        stamp = (str(path), st.st_mtime_ns, st.st_size)
        if stamp not in _DIGESTS:
            _DIGESTS[stamp] = hashlib.sha256(path.read_bytes()).hexdigest()
        out[f"{section}.{key}"] = _DIGESTS[stamp]
    return out


_CHECKED: set[tuple[str, int, int]] = set()


def check_covariance_file(path: str) -> None:
    """Refuse, naming it, a covariance file R that is not a .npy array of finite real numbers (empty, cut short,
    text, objects, another kind of file, nan): read once per content (path, time stamp, size)."""
    from privdl.data.files import read_input, read_matrix

    st = Path(path).stat()
    stamp = (path, st.st_mtime_ns, st.st_size)
    if stamp in _CHECKED:
        return
    read_matrix(path, "covariance file")
    if not read_input(path, "covariance file")[:6] == b"\x93NUMPY":
        raise FileError(f"covariance file {path} is text; a covariance file is a .npy array (numpy.save)")
    _CHECKED.add(stamp)


def build_network(net: dict, run_seed: int = 0, base_dir: str | None = None) -> Network:
    """The network of a ``[network]`` table; ``seed = "run"`` draws a different graph for every run seed; a
    relative ``file`` is read from ``base_dir``. Networks are immutable facts: the same table and seed give the same
    (cached) object."""
    if net.get("file"):
        path, how = resolve_path(net["file"], base_dir, "network.file")
        if not Path(path).exists():
            raise ValidationError(f"network file {path} does not exist{how}")
        net = {**net, "file": path}
    dynamic = net.get("dynamics", "static") != "static"
    if dynamic and wants_directed(net):  # (two issue-46 features built apart: each law draws symmetric W(t))
        raise ValidationError(f"[network] dynamics = {net['dynamics']!r} draws undirected graphs with doubly "
                              "stochastic W(t); a directed network (directed = true, a directed_* topology or "
                              "push_sum mixing) is static: use dynamics = \"static\"")
    for key, law in (("peers", "peer_sampling"), ("graphs", "cycle")):
        if not dynamic and net.get(key) is not None:
            raise ValidationError(f"[network] {key} = {net[key]!r} applies to dynamics = \"{law}\" only; this "
                                  "network is static (dynamics = \"static\", the default)")
    if net.get("graphs") is not None:
        if not isinstance(net["graphs"], list) or not all(isinstance(g, str) and g for g in net["graphs"]):
            raise ValidationError(f"[network] graphs = {net['graphs']!r}: a list of graph file paths")
        paths = []
        for g in net["graphs"]:
            path, how = resolve_path(g, base_dir, "network.graphs")
            if not Path(path).exists():
                raise ValidationError(f"cycle graph file {path} does not exist{how}")
            paths.append(path)
        net = {**net, "graphs": paths}
    key = (json.dumps(net, sort_keys=True, default=str),
           run_seed if net.get("seed") == "run" or dynamic else None)  # (W(t) is drawn from the run's keys)
    if key not in _NETWORKS:
        if len(_NETWORKS) >= 512:
            _NETWORKS.pop(next(iter(_NETWORKS)))
        _NETWORKS[key] = _build_network(net, run_seed) if not dynamic else _dynamic_network(net, run_seed)
    return _NETWORKS[key]


def _dynamic_network(net: dict, run_seed: int) -> Network:
    """A network on a time-varying graph: its ``dynamics`` (the law of W(t), drawn from the run seed's public key)
    on a reference network — the union of the law's graphs over one period (``cycle``, ``one_peer_exponential``),
    or over its first rounds until connected (``random_matching``, ``peer_sampling``) — whose static facts the
    manifest records beside the law."""
    from privdl.network.dynamics import Dynamics

    name = net["dynamics"]
    if net.get("file") and name == "cycle":
        raise ValidationError("[network] dynamics = \"cycle\" reads its graphs from network.graphs; remove "
                              "network.file")
    n = net.get("n", 10)
    if net.get("file"):
        n = _build_network({k: v for k, v in net.items() if k not in ("dynamics", "peers", "graphs")}, run_seed).n
    dyn = Dynamics(name, n, seed=run_seed, mixing=net.get("mixing", "metropolis_hastings"),
                   lazy=net.get("lazy", False), peers=net.get("peers"), graphs=net.get("graphs") or ())
    if name == "cycle" and "n" in net and net["n"] != dyn.n:
        raise ValidationError(f"[network] n = {net['n']} but the cycle's graphs have {dyn.n} agents")
    src, dst = [], []
    rounds = dyn.period or 256
    for t in range(rounds):
        e = dyn.edges(t)
        src.append(e.src.long().numpy())
        dst.append(e.dst.long().numpy())
        if dyn.period is None and t >= 1:
            if _connected(dyn.n, src, dst):
                union = Network.from_edges(dyn.n, np.concatenate(src), np.concatenate(dst))
                break
    else:
        union = Network.from_edges(dyn.n, np.concatenate(src), np.concatenate(dst))
    union.dynamics = dyn
    said = ", ".join(f"{k}={v}" for k, v in dyn.law().items() if k in ("n", "peers", "period"))
    union.description = f"{name} ({said}) over {union.description}"
    return union


def _connected(n: int, src: list, dst: list) -> bool:
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import connected_components

    s, d = np.concatenate(src), np.concatenate(dst)
    return connected_components(csr_array((np.ones(len(s)), (s, d)), shape=(n, n)), directed=False)[0] == 1


_NETWORKS: dict[tuple, Network] = {}


def _build_network(net: dict, run_seed: int) -> Network:
    fixed = ("topology", "n", "mixing", "lazy", "seed", "file", "file_kind", "sparse", "directed")
    if wants_directed(net):
        return build_directed(net, run_seed, _rest(net, *fixed))
    if net.get("file"):
        return load_network_file(net["file"], kind=net.get("file_kind", "auto"),
                                 mixing=net.get("mixing", "metropolis_hastings"), lazy=net.get("lazy", False))
    seed = net.get("seed", 0)
    return Network.from_topology(net.get("topology", "erdos_renyi"), net.get("n", 10),
                                 mixing=net.get("mixing", "metropolis_hastings"), lazy=net.get("lazy", False),
                                 seed=run_seed if seed == "run" else seed, **_rest(net, *fixed))


def check_requirements(algorithm: Algorithm, network: Network) -> None:
    """Refuse a network whose combination matrix lacks a fact the algorithm needs (one W for the whole run:
    ``"fixed_mixing: <reason>"`` in ``requires``, refused on a time-varying graph with that reason)."""
    if getattr(network, "dynamics", None) is not None:
        from privdl.network.dynamics import fixed_mixing_reason

        why = fixed_mixing_reason(algorithm.requires)
        if why is not None:
            raise ValidationError(f"algorithm {algorithm.name!r} needs one mixing matrix for the whole run ({why}); "
                                  f"[network] dynamics = {network.dynamics.name!r} changes W every round: use "
                                  "dynamics = \"static\", or an algorithm that mixes with any W(t) (dsgd, dsgt, psgt, "
                                  "dsg_rms, dsgt_rms)")
        why = fixed_mixing_reason(algorithm.requires, "neighbour_every_round")
        alone = network.dynamics.lonely() if why is not None else None
        if alone is not None:
            raise ValidationError(f"algorithm {algorithm.name!r} needs a neighbour for every agent in every round "
                                  f"({why}); on [network] dynamics = {network.dynamics.name!r} {alone}")
        return
    if "positive_definite" in algorithm.requires:
        if network.sparse:
            _check_positive_definite_sparse(algorithm, network)
            return
        ev = network.symmetric_spectrum
        low = float(np.min(ev if ev is not None else np.linalg.eigvals(network.W).real))
        if low <= 1e-12:
            raise ValidationError(
                f"{algorithm.name} needs a positive-definite combination matrix A (exact diffusion, seed 002 eq. (3)); "
                f"this one has smallest eigenvalue {low:.4g}: use the lazy rule (I + A)/2, [network] lazy = true")


def _check_positive_definite_sparse(algorithm: Algorithm, network: Network) -> None:
    """A sparse symmetric W with every w_ii ≥ 1/2 is (I + W')/2 for a stochastic W' (eigenvalues ≥ −1), so it is
    positive semi-definite, and definite iff W' is primitive; otherwise the smallest eigenvalue is found by Lanczos."""
    from scipy.sparse import eye_array
    from scipy.sparse.linalg import ArpackNoConvergence, eigsh

    from privdl.network.sparse import primitive

    w = network.W
    if w.diagonal().min() >= 0.5 - 1e-12:
        if primitive((2.0 * w - eye_array(network.n, format="csr")).tocsr(), 1):
            return
        low = 0.0
    else:
        try:
            low = float(eigsh(w, k=1, which="SA", return_eigenvectors=False, maxiter=5000)[0])
        except ArpackNoConvergence:
            raise ValidationError(f"{algorithm.name} needs a positive-definite combination matrix and its smallest "
                                  "eigenvalue did not converge on this sparse W: use the lazy rule, [network] "
                                  "lazy = true") from None
        if low > 1e-12:
            return
    raise ValidationError(
        f"{algorithm.name} needs a positive-definite combination matrix A (exact diffusion, seed 002 eq. (3)); "
        f"this one has smallest eigenvalue {low:.4g}: use the lazy rule (I + A)/2, [network] lazy = true")


def _check_theory(algorithm: Algorithm, network: Network, task: Task, schedule: Schedule,
                  mechanism_name: str = "none") -> None:
    """Warn (never refuse) when an RMS run's γ or τ lies outside seed 002's Theorems 1–2, for tasks that know their
    smoothness and strong convexity."""
    rms = algorithm.rms
    if rms is None or not hasattr(task, "smoothness") or network.sparse or network.dynamics is not None:
        return  # the bounds need W's spectrum: not computed for sparse networks (nor for one W: W(t) changes)
    from privdl.algorithms.rms_bounds import rms_bounds, warn_outside

    bounds = rms_bounds(network.W, dim=task.dim, mu=rms.mu, sigma_mu=rms.sigma_mu, sigma_z=rms.sigma_z,
                        smoothness=task.smoothness, strong_convexity=task.strong_convexity)
    outside = warn_outside(algorithm.name, bounds, gamma=float(schedule(1)),
                           tau=float(getattr(algorithm.wire, "tau", 0.0)))
    if outside:
        return
    from privdl.algorithms.rms_bounds import run_error_bounds

    _, reasons = run_error_bounds(algorithm, network, task, schedule, torch.zeros(task.dim, dtype=torch.float64),
                                  mechanism=mechanism_name)
    if reasons.get("gap"):  # (the γ/τ conditions hold, another does not)
        warnings.warn(f"{algorithm.name}: no error-bound metrics (seed 002 Theorems 1–2): {'; '.join(reasons['gap'])}",
                      stacklevel=3)


def computed(section: str, table: dict, make: Callable[[], T]) -> T:
    """``make()``, where a value too small or too large for double precision (σ = 1e-200: σ² is 0; a matrix of
    such numbers whose eigenvalues do not converge) is an error naming the section and its values, not a
    traceback from deep inside the arithmetic."""
    try:
        return make()
    except (ZeroDivisionError, OverflowError, FloatingPointError, np.linalg.LinAlgError) as exc:
        given = ", ".join(f"{k} = {v!r}" for k, v in table.items())
        raise ValidationError(f"[{section}] {given}: a value is too small or too large to compute with in double "
                              f"precision ({type(exc).__name__}: {exc})") from None


def build_task(cfg: dict, n: int) -> Task:
    """The task of a run config for ``n`` agents; ``seed = "run"`` partitions the data by the run seed."""
    params = _rest(cfg["task"], "name")
    if params.get("seed") == "run":
        params["seed"] = cfg.get("seed", 0)
    if params.get("data_dir"):
        params["data_dir"], how = resolve_path(params["data_dir"], cfg.get("base_dir"), "task.data_dir")
        if not Path(params["data_dir"]).is_dir():
            raise DataError(f"data_dir {params['data_dir']} is not a folder{how}; fix it, or leave data_dir out to "
                            "search $PRIVDL_DATA_DIR, ./data and ../shared/data")
    return make_task(cfg["task"]["name"], n, dtype=DTYPES[cfg["dtype"]], **params)


def build_algorithm(cfg: dict) -> Algorithm:
    """The algorithm of a run config (cheap: a recipe; the runner also plans with it)."""
    return make_algorithm(cfg["algorithm"]["name"], **_rest(cfg["algorithm"], "name"))


def build(cfg: dict, *, task: Task | None = None, network: Network | None = None,
          algorithm: Algorithm | None = None, mechanism: GradientMechanism | None = None,
          schedule: Schedule | None = None) -> Components:
    """Every component of one run: each built from its config table, or the object given (``task``: e.g. an already
    built task of the same config; :func:`privdl.train` passes a caller's objects). A given mechanism covers the
    accesses it was built for (its ``steps``: the engine refuses an access beyond them); the algorithm's needs are
    checked against the network either way."""
    network = network if network is not None else build_network(cfg["network"], cfg.get("seed", 0),
                                                                cfg.get("base_dir"))
    task = task if task is not None else build_task(cfg, network.n)
    if task.n != network.n:
        raise ValidationError(f"the task's data are split over {task.n} agents, the network has {network.n}")
    algorithm = algorithm if algorithm is not None else build_algorithm(cfg)
    # a directed network: what may run on it, as each declares (the mechanism's class, before its design is built)
    check_directed(algorithm, mechanism if mechanism is not None else MECHANISMS.get(cfg["mechanism"]["name"]),
                   network)
    check_requirements(algorithm, network)
    if network.dynamics is not None:  # (before a design for one W is computed)
        from privdl.network.dynamics import check_mechanism

        if mechanism is None:
            check_mechanism(MECHANISMS.get(cfg["mechanism"]["name"]), network.dynamics, cfg["mechanism"]["name"])
    if mechanism is None:
        mechanism = build_mechanism(cfg, network, task, algorithm)
    if getattr(mechanism, "mixing_network", None) is not None:  # (whisper, optimize_mixing: W designed with R)
        network = mechanism.mixing_network
    check_combination(algorithm, mechanism)  # what the mechanism needs of the algorithm, as it declares it
    if network.dynamics is not None:
        check_mechanism(mechanism, network.dynamics)
    if schedule is None:
        schedule = make_schedule(cfg["schedule"]["name"], iterations=cfg["iterations"],
                                 **_rest(cfg["schedule"], "name"))
    _check_theory(algorithm, network, task, schedule, cfg["mechanism"]["name"])
    sparse = cfg["network"].get("sparse", "auto")
    return Components(network, task, algorithm, mechanism, schedule, None if sparse == "auto" else bool(sparse))


def build_mechanism(cfg: dict, network: Network, task: Task, algorithm: Algorithm) -> GradientMechanism:
    """The mechanism of a run config, covering every noisy access the algorithm makes to each agent's data."""
    # privacy is accounted over every noisy access to each agent's data, which may exceed the iterations (inner
    # steps, initialisation, cross-gradients)
    accesses = (algorithm.accesses(cfg["iterations"], network.edges) if network.dynamics is None
                else network.dynamics.accesses(algorithm, cfg["iterations"]))
    mech = _rest(cfg["mechanism"], "name")
    if isinstance(mech.get("file"), str):
        mech["file"], how = resolve_path(mech["file"], cfg.get("base_dir"), "mechanism.file")
        if not Path(mech["file"]).exists():
            raise ValidationError(f"covariance file {mech['file']} does not exist{how}")
        check_covariance_file(mech["file"])
    if cfg.get("device") in (None, "cpu"):  # (privdl.covariance loaded only by a run that solves a design)
        on_device = contextlib.nullcontext()
    else:
        from privdl.covariance.dual_device import eigh_device

        on_device = eigh_device(cfg.get("device"))
    with on_device:  # (a run on a GPU solves its Whisper design's eigenproblems there)
        return computed("mechanism", cfg["mechanism"],
                        lambda: make_mechanism(cfg["mechanism"]["name"], steps=accesses, network=network,
                                               task=task, **mech))
