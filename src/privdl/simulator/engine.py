"""The synchronous simulator: all n agents in one process, one (n, d) tensor, T rounds.

Random streams are keyed by (seed, purpose, t): the mini-batches of round t come from ("batch", t), the noise from
("noise", t), so a run is bit-reproducible from its seed whatever else happens in the process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from privdl.algorithms.base import Algorithm, StepContext
from privdl.errors import ValidationError
from privdl.mechanisms.base import Mechanism
from privdl.network.network import Network
from privdl.rng import Streams
from privdl.schedules import Schedule
from privdl.simulator.gradients import gradient_oracle
from privdl.tasks.base import Task


@dataclass
class SimulationResult:
    records: list[tuple[int, str, float]]  # (iteration, metric, value)
    final: torch.Tensor  # agents' models (n, d)
    seconds: float
    iterations: int
    extra: dict = field(default_factory=dict)


def checkpoints(iterations: int, eval_every: int) -> list[int]:
    """Iterations at which metrics are recorded: 0, every ``eval_every``, and the last."""
    pts = set(range(0, iterations + 1, max(1, eval_every)))
    pts.add(iterations)
    return sorted(pts)


def simulate(
    *, task: Task, network: Network, algorithm: Algorithm, mechanism: Mechanism, schedule: Schedule,
    iterations: int, seed: int, eval_every: int = 0, gradient: str = "auto", sparse: bool | None = None,
    on_step: Callable[[int], None] | None = None, x0: torch.Tensor | None = None, metrics: bool = True,
    device: str | torch.device | None = None,
) -> SimulationResult:
    """Run ``algorithm`` with ``mechanism`` on ``task`` over ``network`` for ``iterations`` synchronous rounds
    (``metrics=False`` skips the task's metrics, e.g. when only the final models matter). ``device`` ("cuda",
    "auto" = cuda when available) moves the task's data and the agents' state there; every random draw still comes
    from the CPU's keyed streams, so the lots and the noise are the same numbers on every device."""
    streams = Streams(seed)
    if device is not None:
        task.to(resolve_device(device))
    oracle = gradient_oracle(task, gradient)
    n = network.n
    if x0 is None:
        x0 = task.init_params(streams.torch("init")).expand(n, -1).clone()
    state = algorithm.init(x0.to(dtype=task.dtype, device=task.device))
    mix = lambda x: network.mix(x, sparse=sparse)  # noqa: E731
    neighbours = network.neighbour_operator(task.dtype, task.device)
    marks = set(checkpoints(iterations, eval_every or iterations))
    records: list[tuple[int, str, float]] = []

    def record(t: int) -> None:
        if not metrics:
            return
        for k, v in task.metrics(algorithm.params(state)).items():
            records.append((t, k, v))

    record(0)
    mechanism.start(streams)
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(1, iterations + 1):
            batch_gen, noise_gen = streams.torch("batch", t), streams.torch("noise", t)

            def private_gradient(x: torch.Tensor) -> torch.Tensor:
                return mechanism.noisy_gradient(task, x, t, batch_gen, noise_gen, oracle)

            state = algorithm.step(state, StepContext(t, schedule(t), private_gradient, mix, neighbours))
            if t in marks:
                record(t)
            if on_step is not None:
                on_step(t)
    if task.device.type == "cuda":
        torch.cuda.synchronize(task.device)
    seconds = time.perf_counter() - start
    return SimulationResult(records, algorithm.params(state).cpu().clone(), seconds, iterations)


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` → cuda when torch sees one, else cpu; anything else as given, checked to exist."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError(f"device {str(device)!r} asked for, but this torch ({torch.__version__}) sees no CUDA "
                              "device; use device 'cpu' or 'auto'")
    return dev
