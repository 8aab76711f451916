"""Run state and per-agent checkpoints: everything a run needs to continue, saved at round boundaries.

:class:`RunState` is the state the engine owns between two rounds: the algorithm's state (optimizer state
included: a NamedTuple tree of tensors and numbers), the oracle's access counter (which keys every draw of the
next access), the mechanism's access counts per row (the privacy budget spent; the ledger's events follow from
them), and — held by the process that writes results — the metrics recorded so far (with the running sums of
``*_avg`` metrics) and the state of observers that keep some (an eavesdropper's window). Keyed draws need no
state: a draw is a pure function of its key and its counter (privdl.keys).

A synchronous round boundary is a consistent cut (no message in flight), so a checkpoint is one file per agent —
``round-<t>/agent-<i>.pt``, holding the agent's rows of every per-agent tensor (and of every per-edge tensor, for
its incoming edges), the values every agent shares (step counters) and its access count — plus ``round-<t>/run.pt``
for the recorder. Files are written atomically (temporary file, fsync, rename, fsync of the folder), carry a
SHA-256 of their contents and a header naming the run (id, configuration digest, privdl source hash, n, agent,
round), and are read with ``torch.load(weights_only=True)`` after the digest checks out: a truncated, corrupt or
foreign file is refused by name, never loaded. Resuming takes the last round that every agent (and the recorder)
has; the continued run equals an uninterrupted one bit for bit (``tests/test_checkpoint.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from privdl.comm.observers import as_rows, is_bytes_state, join_states, slice_state
from privdl.errors import PrivdlError
from privdl.private_file import write_private

MAGIC = b"privdl-checkpoint/1\n"
FORMAT = 1
ROUND = re.compile(r"round-(\d+)$")


class CheckpointError(PrivdlError):
    """A checkpoint that cannot be used: missing, truncated, corrupt, or of another run, version or layout."""


@dataclass
class RunState:
    """The engine's state after round ``t``: see the module docstring."""

    t: int
    algorithm: Any
    oracle_calls: int
    mechanism_calls: torch.Tensor
    records: list = field(default_factory=list)  # per system: [(t, metric, value)]
    sums: list = field(default_factory=list)  # per system: {metric: running sum}
    counts: list = field(default_factory=list)  # per system: recorded rounds so far
    observers: list = field(default_factory=list)  # state_dict() of observers that have one


def _kinds(leaves: Sequence[Any], rows: int, edges: int) -> list[str]:
    """How each leaf of an algorithm state splits over agents: by row (one per agent), by edge (owned by its
    receiver), or shared (numbers every agent holds the same)."""
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.ndim >= 1 and leaf.shape[0] == rows:
            out.append("row")
        elif isinstance(leaf, torch.Tensor) and leaf.ndim >= 1 and leaf.shape[0] == edges and edges:
            out.append("edge")
        else:
            out.append("shared")
    return out


def _write(path: Path, payload: dict, mac: bytes | None = None) -> None:
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    write_private(path, MAGIC + _seal(data, mac) + b"\n" + data)


HMAC_TAG = b"hmac-sha256:"


def _seal(data: bytes, mac: bytes | None) -> bytes:
    """The line a checkpoint's contents are checked by: their SHA-256, or (``mac``: an agent's checkpoint key, agreed
    runs) their HMAC-SHA256 under it — which only the agent's holder can compute."""
    if mac is None:
        return hashlib.sha256(data).hexdigest().encode()
    return HMAC_TAG + hmac.new(mac, data, hashlib.sha256).hexdigest().encode()


def _read(path: Path, mac: bytes | None = None, agent: object = None) -> dict:
    """A checkpoint file's payload, its digest (or, with ``mac``, its HMAC under agent ``agent``'s key) checked."""
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    if not blob.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a privdl checkpoint (or its first bytes are damaged)")
    rest = blob[len(MAGIC):]
    digest, _, data = rest.partition(b"\n")
    if mac is not None:
        if not digest.startswith(HMAC_TAG):
            raise CheckpointError(f"checkpoint {path} of agent {agent} carries no HMAC: it was not written by this "
                                  "agreed-key run (root keys, or edited and re-digested); delete the checkpoints "
                                  "folder to start the run over")
        if not hmac.compare_digest(digest, _seal(data, mac)):
            raise CheckpointError(f"checkpoint {path} fails its HMAC under agent {agent}'s key: it was edited, "
                                  "truncated, or is another agent's or another run's file; delete its round folder "
                                  "to resume from the round before")
    elif digest.startswith(HMAC_TAG):
        raise CheckpointError(f"checkpoint {path} is authenticated with an agreed-key run's keys, which this run does "
                              "not hold (another run)")
    elif hashlib.sha256(data).hexdigest().encode() != digest:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt (its SHA-256 does not match its "
                              "contents); delete its round folder to resume from the round before")
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch says, the file is not one we wrote
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {exc}") from None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Checkpoints:
    """The checkpoints of one engine: ``folders[r]`` is replica r's checkpoint folder (one per run of a stacked
    batch), ``identity[r]`` what names that run (run id, config digest, ...: compared on resume), ``n`` agents per
    replica, ``agents`` the agents this engine holds (all by default), ``every`` rounds between checkpoints,
    ``writes_run`` whether this engine writes the recorder's file. ``held_frame``: the engine's tensors have one row
    per agent it holds (row k is ``agents[k]``; :mod:`privdl.placement`) instead of one per agent of the network;
    an agent's file holds its rows either way."""

    def __init__(self, folders: Sequence[Path], identity: Sequence[dict], *, n: int, every: int,
                 agents: Sequence[int] | None = None, writes_run: bool = True, keep: int = 2,
                 held_frame: bool = False) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise CheckpointError(f"runtime.checkpoint_every must be an integer >= 1 (rounds), got {every!r}")
        self.folders = [Path(f) for f in folders]
        self.identity = [dict(i) for i in identity]
        self.n, self.every, self.keep = int(n), int(every), int(keep)
        self.agents = list(range(self.n)) if agents is None else sorted(int(a) for a in agents)
        self.writes_run = writes_run
        self.held_frame = bool(held_frame)
        if self.held_frame and len(self.folders) != 1:
            raise CheckpointError("a held-frame engine holds one run (stacked replicas use the network frame)")
        #: agent → its checkpoint key (agreed runs: :meth:`authenticate`); None: files carry a SHA-256
        self.macs: dict[int, bytes] | None = None

    def held_by(self, agents: Sequence[int], *, writes_run: bool = False, held_frame: bool = False) -> "Checkpoints":
        """The same checkpoints as one engine that holds ``agents`` sees them (its files to write, read and remove;
        ``held_frame``: its tensors have one row per agent it holds)."""
        return Checkpoints(self.folders, self.identity, n=self.n, every=self.every, agents=agents,
                           writes_run=writes_run, keep=self.keep, held_frame=held_frame)

    def authenticate(self, macs: dict[int, bytes] | None) -> None:
        """Seal and check every agent file with an HMAC under its agent's own key (``macs``: agent → key, for the
        agents this engine holds; None: SHA-256 only). An agreed run's keys come from its agents' secrets, so only
        their holder can write a file the run will accept."""
        if macs is not None:
            missing = [i for i in self.agents if i not in macs]
            if missing:
                raise CheckpointError(f"no checkpoint key for agent {missing[0]}, which this engine holds")
        self.macs = None if macs is None else dict(macs)

    def _mac(self, agent: int) -> bytes | None:
        return None if self.macs is None else self.macs[agent]

    # ---- saving ---------------------------------------------------------------------------------------------------
    def _row(self, r: int, k: int, i: int) -> int:
        """The row of replica r's agent i (the k-th this engine holds) in the engine's tensors."""
        return k if self.held_frame else r * self.n + i

    @property
    def frame_rows(self) -> int:
        """Rows of the engine's per-agent tensors."""
        return len(self.agents) if self.held_frame else len(self.folders) * self.n

    def due(self, t: int) -> bool:
        return t % self.every == 0

    def save(self, state: RunState, *, edges_dst: torch.Tensor) -> None:
        """Write round ``state.t``: one file per held agent and replica (and the recorder's file)."""
        leaves, _ = pytree.tree_flatten(state.algorithm)
        rows = self.frame_rows
        kinds = _kinds(leaves, rows, 0 if self.held_frame else int(edges_dst.numel()))
        dst = edges_dst.cpu().long()
        for r, folder in enumerate(self.folders):
            where = folder / f"round-{state.t:09d}"
            where.mkdir(parents=True, exist_ok=True)
            for k, i in enumerate(self.agents):
                row, agent = self._row(r, k, i), r * self.n + i
                mine = [leaf[row].detach().cpu().clone() if kind == "row" else
                        leaf[(dst == row).nonzero().reshape(-1).to(leaf.device)].detach().cpu().clone()
                        if kind == "edge" else (leaf.detach().cpu().clone() if isinstance(leaf, torch.Tensor)
                                                else leaf)
                        for leaf, kind in zip(leaves, kinds)]
                _write(where / f"agent-{i}.pt", mac=self._mac(i), payload={
                    "header": {**self.identity[r], "format": FORMAT, "agent": i, "round": state.t, "n": self.n},
                    "kinds": kinds, "leaves": mine, "oracle_calls": int(state.oracle_calls),
                    "mechanism_calls": int(state.mechanism_calls[agent])})
            _fsync_dir(where)
        if self.writes_run:
            self.save_run(state)

    def save_run(self, state: RunState) -> None:
        """The recorder's file of round ``state.t`` (written last: it completes the round's checkpoint)."""
        for r, folder in enumerate(self.folders):
            where = folder / f"round-{state.t:09d}"
            where.mkdir(parents=True, exist_ok=True)
            _write(where / "run.pt", {
                "header": {**self.identity[r], "format": FORMAT, "agent": "run", "round": state.t, "n": self.n},
                "records": [list(x) for x in state.records[r]] if state.records else [],
                "sums": dict(state.sums[r]) if state.sums else {},
                "counts": int(state.counts[r]) if state.counts else 0,
                "observers": [self._own_part(o, r) for o in state.observers]})
            _fsync_dir(where)
            self._prune(folder)

    def _own_part(self, observer_state: object, r: int) -> object:
        """Run r's part of an observer's state: its rows of a stacked batch's byte meter (the others whole)."""
        parts = len(self.folders)
        if parts > 1 and is_bytes_state(observer_state) and observer_state["rows"] == parts * self.n:
            return slice_state(observer_state, r * self.n, (r + 1) * self.n)
        return observer_state

    def _prune(self, folder: Path) -> None:
        rounds = sorted(self._rounds(folder))
        for t in rounds[:-self.keep]:
            shutil.rmtree(folder / f"round-{t:09d}", ignore_errors=True)

    # ---- resuming -------------------------------------------------------------------------------------------------
    @staticmethod
    def _rounds(folder: Path) -> list[int]:
        if not folder.is_dir():
            return []
        return [int(m.group(1)) for p in folder.iterdir() if (m := ROUND.match(p.name)) and p.is_dir()]

    def _complete(self, folder: Path, t: int, everyone: bool) -> bool:
        """Whether round ``t`` has every agent's file (``everyone``) or this engine's agents' — and the recorder's
        file, unless this engine neither writes it nor looks at everyone (another host's process 0 holds it)."""
        where = folder / f"round-{t:09d}"
        agents = range(self.n) if everyone else self.agents
        return (all((where / f"agent-{i}.pt").is_file() for i in agents)
                and ((where / "run.pt").is_file() or not (everyone or self.writes_run)))

    def held_rounds(self) -> list[int]:
        """The rounds, increasing, that this engine's own files complete in every replica's folder: each of its
        agents' files and, if it writes the recorder's, ``run.pt``. A process on a host of its own sees only
        these; :func:`agreed_round` then finds the round every process has."""
        common: set[int] | None = None
        for folder in self.folders:
            done = {t for t in self._rounds(folder) if self._complete(folder, t, everyone=False)}
            common = done if common is None else common & done
        return sorted(common or ())

    def _missing(self, folder: Path, t: int) -> list[str]:
        where = folder / f"round-{t:09d}"
        out = [f"agent {i}" for i in range(self.n) if not (where / f"agent-{i}.pt").is_file()]
        return out + ([] if (where / "run.pt").is_file() else ["the recorder's run.pt"])

    def latest(self) -> int | None:
        """The last round that every agent of every replica (and the recorder) has; None without any checkpoint.
        A newer round that some agent lacks (a process stopped while writing it) is passed over with a warning
        naming what is missing; checkpoints none of whose rounds is complete are refused."""
        common: set[int] | None = None
        newest, gap = None, None
        for folder in self.folders:
            rounds = self._rounds(folder)
            done = {t for t in rounds if self._complete(folder, t, everyone=True)}
            common = done if common is None else common & done
            for t in rounds:
                if t not in done and (newest is None or t > newest):
                    newest, gap = t, (folder, self._missing(folder, t))
        best = max(common) if common else None
        if gap is not None and (best is None or newest > best):
            folder, missing = gap
            where = folder / f"round-{newest:09d}"
            if best is None:
                raise CheckpointError(f"checkpoint round {newest} in {where} lacks {', '.join(missing[:5])}"
                                      f"{' …' if len(missing) > 5 else ''}, and no earlier round is complete: "
                                      "nothing to resume from (delete the checkpoints folder to start over)")
            warnings.warn(f"checkpoint round {newest} in {where} lacks {', '.join(missing[:5])}; resuming from "
                          f"round {best}, the last round every agent has", stacklevel=2)
        return best

    def _check(self, path: Path, header: dict, r: int, t: int, agent: object) -> None:
        want = {**self.identity[r], "format": FORMAT, "agent": agent, "round": t, "n": self.n}
        diff = [k for k in want if header.get(k) != want[k]]
        if diff:
            k = diff[0]
            what = {"config_digest": "another configuration", "source": "another privdl source version",
                    "run_id": "another run", "n": "another number of agents", "format": "another checkpoint format",
                    "agent": "another agent", "round": "another round"}.get(k, k)
            raise CheckpointError(f"checkpoint {path} is of {what} ({k}: {header.get(k)!r}, this run: {want[k]!r}); "
                                  "delete the checkpoints folder to start the run over")

    def load(self, t: int, template: Any, *, rows: int, edges_dst: torch.Tensor,
             expected_calls: torch.Tensor | None = None) -> RunState:
        """The state of round ``t`` for this engine's agents (rows of agents it does not hold are zeros), the
        algorithm's state rebuilt on ``template`` (a state of the same run, e.g. after ``init``).
        ``expected_calls[row]``: the accesses to each row's data that t rounds of this run make (the algorithm's
        count); a file that states another number is refused, naming the field — the ledger is built from it."""
        leaves, spec = pytree.tree_flatten(template)
        kinds = _kinds(leaves, rows, 0 if self.held_frame else int(edges_dst.numel()))
        out = [torch.zeros_like(leaf) if kind != "shared" else leaf for leaf, kind in zip(leaves, kinds)]
        dst = edges_dst.cpu().long()
        calls = torch.zeros(len(self.folders) * self.n, dtype=torch.int64)  # by global row (the mechanism's)
        oracle_calls, shared_from = None, None
        for r, folder in enumerate(self.folders):
            where = folder / f"round-{t:09d}"
            for k_agent, i in enumerate(self.agents):
                path = where / f"agent-{i}.pt"
                got = _read(path, self._mac(i), i)
                self._check(path, got.get("header", {}), r, t, i)
                if got.get("kinds") != kinds or len(got.get("leaves", ())) != len(leaves):
                    raise CheckpointError(f"checkpoint {path} holds another algorithm state than this run's "
                                          f"({got.get('kinds')} against {kinds})")
                row, agent = self._row(r, k_agent, i), r * self.n + i
                for k, (value, kind) in enumerate(zip(got["leaves"], kinds)):
                    if kind == "row":
                        out[k][row] = value.to(out[k].device, out[k].dtype)
                    elif kind == "edge":
                        out[k][(dst == row).nonzero().reshape(-1).to(out[k].device)] = value.to(out[k].device,
                                                                                                   out[k].dtype)
                    elif shared_from is None:
                        out[k] = value.to(leaves[k].device) if isinstance(value, torch.Tensor) else value
                shared_from = shared_from or path
                calls[agent] = int(got["mechanism_calls"])
                if expected_calls is not None and int(calls[agent]) != int(expected_calls[agent]):
                    raise CheckpointError(
                        f"checkpoint {path} (agent {i}, round {t}): mechanism_calls = {int(calls[agent])}, but {t} "
                        f"rounds of this run make {int(expected_calls[agent])} accesses to agent {i}'s data — the "
                        "file was edited or is of another run, and the privacy ledger would state a wrong count; "
                        "delete the checkpoints folder to start the run over")
                if oracle_calls is None:
                    oracle_calls = int(got["oracle_calls"])
                elif oracle_calls != int(got["oracle_calls"]):
                    raise CheckpointError(f"checkpoint {path} was written at another access count than the other "
                                          "agents' of its round")
        state = RunState(t, pytree.tree_unflatten(out, spec), int(oracle_calls or 0), calls)
        if self.writes_run:
            self.load_run(t, state)
        return state

    def load_run(self, t: int, state: RunState) -> RunState:
        """Read the recorder's file of round ``t`` into ``state`` (records, running sums, observers; the runs'
        byte meters joined into the batch's)."""
        every: list[list] = []
        for r, folder in enumerate(self.folders):
            path = folder / f"round-{t:09d}" / "run.pt"
            got = _read(path)
            self._check(path, got.get("header", {}), r, t, "run")
            seen = {int(x[0]) for x in got["records"]}
            if (seen and int(got["counts"]) != len(seen)) or any(x > t for x in seen):
                raise CheckpointError(f"checkpoint {path}: counts = {int(got['counts'])} recorded rounds, but its "
                                      f"records hold {len(seen)} (up to round {max(seen, default=0)}) at round {t}: "
                                      "the file was edited; delete the checkpoints folder to start the run over")
            state.records.append([tuple(x) for x in got["records"]])
            state.sums.append(dict(got["sums"]))
            state.counts.append(int(got["counts"]))
            state.observers = got["observers"]
            every.append(got["observers"])
        if len(every) > 1:  # a stacked batch: its runs' byte counts joined (a coordinator's totals as a run's base)
            state.observers = [join_states([as_rows(p, self.n) for p in parts])
                               if all(is_bytes_state(p) for p in parts) else parts[-1] for parts in zip(*every)]
        return state

    def remove_held(self, before: int | None = None) -> None:
        """Remove this engine's agents' files of every round (of the rounds before ``before`` only, if given), then
        the round folders and the checkpoint folder that are left empty: the run was saved (or those rounds are
        older than rounds known complete everywhere), and on a host whose folder no other process shares (several
        hosts without a shared folder) nothing else removes them. Files of agents this engine does not hold are
        kept."""
        for folder in self.folders:
            for t in self._rounds(folder):
                if before is not None and t >= before:
                    continue
                where = folder / f"round-{t:09d}"
                for i in self.agents:
                    (where / f"agent-{i}.pt").unlink(missing_ok=True)
                _remove_if_empty(where)
            if before is None:
                _remove_if_empty(folder)

    def clear(self) -> None:
        """Remove the checkpoints (the run finished and was saved)."""
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


def agreed_round(rounds: Sequence[int], agree_max: Callable[[int], int]) -> int | None:
    """The newest round in every engine's ``rounds`` (its :meth:`Checkpoints.held_rounds`), or None if there is none,
    agreed with ``agree_max`` (the engines' largest value of an integer, a control operation every engine calls the
    same number of times). Each pass proposes the smallest of the engines' newest rounds up to the current proposal;
    it stops when every engine holds the proposal (the proposal did not move), or when some engine holds no round up
    to it. The proposal only falls, so at most one pass per distinct round. No folder is read but the engine's own:
    hosts need not share one."""
    mine = sorted({int(t) for t in rounds})
    proposal = -agree_max(-(mine[-1] if mine else -1))
    while proposal >= 0:
        below = [t for t in mine if t <= proposal]
        answer = -agree_max(-(below[-1] if below else -1))
        if answer == proposal:
            return proposal
        proposal = answer
    return None


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (another engine's files), or already gone
        pass


__all__ = ["CheckpointError", "Checkpoints", "RunState"]
