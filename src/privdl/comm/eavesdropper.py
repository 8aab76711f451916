"""The eavesdropper of seed 002 §5.1/§5.3: an observer on every link that averages what each agent transmits over a
sliding window of rounds and takes that as its estimate of the network's target w*.

Zero-mean perturbations of the transmitted values (PD-LMS, LDP noise) average out, so the sliding average of an
agent's messages approaches w* near consensus; a non-zero protection vector (DSG-RMS / EDSG-RMS) biases it. The
**adaptive** eavesdropper also knows the protection law and τ (Kerckhoffs' principle: the algorithm is public) and
undoes the protection message by message before averaging (:meth:`privdl.mechanisms.protection.Protection.recover`,
exact when the protected reference equals the transmitted value, ψ ≈ w).

It listens to one tag — by default the first tag transmitted in a round (the estimate: ``x``, ``phi``, ``psi``, …;
gradient tracking's second message, ``y``, is ignored) — and, per round, to the first transmission with that tag.
A sender's value of a round is the mean of its payloads on all its links (per-link perturbations average too).
On a push-sum run (SGP on a directed graph: ``transmits`` names a ``push_sum_numerator`` and a ``push_sum_weight``
tag) the numerators x − η g̃ alone are a poor estimate — they are scaled by the push-sum weight w, far from 1 on a
graph whose Perron vector is not uniform. An eavesdropper that hears both messages of a sender in a round
de-biases: its value of the round is (mean of the numerator payloads) / (mean of the weight payloads), an estimate
of the sender's de-biased iterate z = x / w (exactly z of the round with no gradient noise and η = 0; here the
numerator is one step ahead, z − η g̃ / w). A sender heard on the numerator tag only keeps its numerator.
Metrics (:meth:`metrics`): ``eavesdropper_msd`` = (1/K) Σ_k ‖ŵ_k − w*(n)‖², and ``adaptive_eavesdropper_msd`` when
the algorithm's protection law is known.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch

from privdl.errors import ValidationError


class Eavesdropper:
    """Sliding averages of every sender's transmissions; ``target(t)`` gives w*(t) for the error metrics."""

    def __init__(self, rows: int, *, window: int = 100, target: Callable[[int], torch.Tensor], wire: Any = None,
                 tag: str | None = None, transmits: dict | None = None) -> None:
        if window < 1:
            raise ValidationError(f"eavesdropper window must be >= 1 round, got {window}")
        self.rows, self.window, self.target, self.wire, self.tag = rows, int(window), target, wire, tag
        # push-sum: the tags of the numerator and of the weight (``Algorithm.transmits``: tag → kind); with both
        # known, a round's value is held until the weight message of that round de-biases it
        kinds = {kind: t for t, kind in (transmits or {}).items()}
        numerator, self.weight_tag = kinds.get("push_sum_numerator"), kinds.get("push_sum_weight")
        if numerator is None or self.weight_tag is None or (tag is not None and tag != numerator):
            self.weight_tag = None
        elif self.tag is None:
            self.tag = numerator
        self._pending: tuple | None = None  # (round, plain, adaptive, links) awaiting the weight message
        # per kind (plain, adaptive): the last ``window`` rounds' per-sender values and their running sum
        self._buffers: dict[bool, deque[torch.Tensor]] = {False: deque(), True: deque()}
        self._sums: dict[bool, torch.Tensor | None] = {False: None, True: None}
        # which senders sent in each round of the window (a time-varying graph: an idle agent sends nothing, and
        # its average is over the rounds it sent in)
        self._sent: deque[torch.Tensor] = deque()
        self._seen: torch.Tensor | None = None
        self._round = -1
        self._cache: tuple[int, dict[bool, torch.Tensor | None]] | None = None
        self._links: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def on_message(self, *, t: int, tag: str, src: torch.Tensor, dst: torch.Tensor, payload: torch.Tensor) -> None:
        if self.weight_tag is not None and tag == self.weight_tag:
            if self._pending is not None and self._pending[0] == t:
                self._debias(src, payload)
            return
        if self.tag is None:
            self.tag = tag
        if tag != self.tag or t == self._round:
            return
        self._flush()  # (a held round whose weight never came: its numerators as they are)
        self._round = t
        flat = payload.detach().reshape(payload.shape[0], -1).to(torch.float64).cpu()
        src, count = self._senders(src)

        def per_sender(values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(self.rows, values.shape[1], dtype=torch.float64).index_add_(0, src, values).div_(count)

        plain = per_sender(flat)
        adaptive = per_sender(self.wire.recover(flat)) if self.wire is not None else None
        self._pending = (t, plain, adaptive, self._links[3])
        if self.weight_tag is None:
            self._flush()

    def _debias(self, src: torch.Tensor, payload: torch.Tensor) -> None:
        """Divide the held round's per-sender numerators by the senders' push-sum weights (mean over their links;
        a sender not heard on the weight tag keeps its numerator), then record the round."""
        t, plain, adaptive, sent = self._pending
        cpu = src.cpu().long()
        w = payload.detach().reshape(payload.shape[0], -1).to(torch.float64).cpu()[:, :1]
        links = torch.bincount(cpu, minlength=self.rows).to(torch.float64)[:, None]
        weight = torch.zeros(self.rows, 1, dtype=torch.float64).index_add_(0, cpu, w)
        weight = torch.where(links > 0, weight / links.clamp(min=1), torch.ones_like(weight))
        self._pending = (t, plain / weight, None if adaptive is None else adaptive / weight, sent)
        self._flush()

    def _flush(self) -> None:
        """Record the held round (if any) in the sliding windows."""
        if self._pending is None:
            return
        _, plain, adaptive, sent = self._pending
        self._pending = None
        self._sent.append(sent)
        self._seen = sent.clone() if self._seen is None else self._seen + sent
        if len(self._sent) > self.window:
            self._seen -= self._sent.popleft()
        self._push(False, plain)
        if adaptive is not None:
            self._push(True, adaptive)

    def _senders(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The senders on the CPU and their numbers of links, (rows, 1); kept while the edge list is the same
        tensor (every round of a run)."""
        if self._links is None or self._links[0] is not src:
            cpu = src.cpu().long()  # index_add_ is about 3× slower with int32 indices
            links = torch.bincount(cpu, minlength=self.rows)
            count = links.clamp(min=1).to(torch.float64)[:, None]
            self._links = (src, cpu, count, (links > 0).to(torch.float64)[:, None])
        return self._links[1], self._links[2]

    def _push(self, adaptive: bool, value: torch.Tensor) -> None:
        buffer = self._buffers[adaptive]
        buffer.append(value)
        total = self._sums[adaptive]
        total = value.clone() if total is None else total + value
        if len(buffer) > self.window:
            total -= buffer.popleft()
        self._sums[adaptive] = total
        self._cache = None

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the window of per-sender values and their running sums, the last round seen."""
        self._flush()
        return {"tag": self.tag, "round": self._round,
                "buffers": {str(k): [v.clone() for v in b] for k, b in self._buffers.items()},
                "sums": {str(k): None if v is None else v.clone() for k, v in self._sums.items()},
                "sent": [v.clone() for v in self._sent]}

    def load_state_dict(self, state: dict) -> None:
        self.tag, self._round = state["tag"], int(state["round"])
        self._buffers = {k: deque(state["buffers"][str(k)]) for k in (False, True)}
        self._sums = {k: state["sums"][str(k)] for k in (False, True)}
        ones = torch.ones(self.rows, 1, dtype=torch.float64)  # (a checkpoint from before: every sender sent)
        self._sent = deque(state.get("sent", [ones] * len(self._buffers[False])))
        self._seen = sum(self._sent, torch.zeros_like(ones)) if self._sent else None
        self._cache = None

    def estimate(self, adaptive: bool = False) -> torch.Tensor | None:
        """Every sender's sliding average (rows, L), or None before the first message."""
        self._flush()  # (the weight message of a held round comes in the same step, before any reader)
        total = self._sums[adaptive]
        if total is None:
            return None
        seen = self._seen
        if seen is None or bool((seen == len(self._buffers[adaptive])).all()):
            return total / len(self._buffers[adaptive])  # every sender sent in every round of the window
        return total / seen.clamp(min=1)

    def metrics(self, t: int, rows: slice = slice(None)) -> dict[str, float]:
        self._flush()
        if self._cache is None or self._cache[0] != t:  # one computation per round for every replica
            target = self.target(t).to(torch.float64)
            errors: dict[bool, torch.Tensor | None] = {}
            for adaptive in (False, True):
                est = self.estimate(adaptive) if (not adaptive or self.wire is not None) else None
                errors[adaptive] = None if est is None else ((est - target[None]) ** 2).sum(dim=1)
            self._cache = (t, errors)
        out: dict[str, float] = {}
        for name, adaptive in (("eavesdropper_msd", False), ("adaptive_eavesdropper_msd", True)):
            err = self._cache[1][adaptive]
            if err is not None:
                heard = None if self._seen is None else (self._seen[:, 0] > 0)[rows]
                out[name] = float(err[rows].mean() if heard is None or bool(heard.all()) else err[rows][heard].mean())
        return out


__all__ = ["Eavesdropper"]
