"""Which torch device a run's ``device`` names: a room of its own below everything that places tensors (the
covariance solver, the simulator, the runner's batch sizing, the distributed runtime's processes).

A process of the distributed runtime (``privdl run --procs K``, torchrun) picks its device with
:func:`process_device`, a pure function of the config's ``device``, the process's place on its host (local rank r
of k processes), the GPUs the host shows it (G) and the transport: ``"cuda"`` → ``cuda:(r mod G)`` (round robin:
with k ≤ G every process has a GPU of its own, with k > G up to ⌈k/G⌉ processes share one), ``"cuda:N"`` → GPU N
for every process of the host, ``"auto"`` → ``"cuda"`` where the host shows a GPU, else the CPU. Which GPUs a host
shows is ``CUDA_VISIBLE_DEVICES``'s business (set it per host or per launch to map processes to other GPUs)."""

from __future__ import annotations

import torch

from privdl.errors import PrivdlError, ValidationError
from privdl.runtime_spec import RuntimeSpec

#: NCCL's own words when two processes of one communicator sit on one GPU (../shared/RUNTIME.md, fact 8)
NCCL_SHARED = "Duplicate GPU detected"


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` → cuda when torch sees one, else cpu; anything else as given, checked to exist."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError(f"device {str(device)!r} asked for, but this torch ({torch.__version__}) sees no CUDA "
                              "device; use device 'cpu' or 'auto'")
    return dev


def visible_gpus() -> int:
    """The CUDA devices this process sees (0 without CUDA: a CPU build of torch, no driver, or
    ``CUDA_VISIBLE_DEVICES`` empty)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def process_device(device: str | torch.device | None, *, local_rank: int, local_world: int, gpus: int,
                   transport: str = "gloo", who: str | None = None) -> torch.device:
    """The device of the process with local rank ``local_rank`` of the ``local_world`` processes on its host, which
    shows ``gpus`` GPUs, for a run's ``device`` moved by ``transport`` (module docstring: ``"cuda"`` → ``cuda:(r
    mod G)``). Refused with a :class:`ValidationError` naming why: a GPU asked for where this process sees none, a
    ``cuda:N`` the host does not show, NCCL on the CPU (it moves GPU tensors only), NCCL with two processes of
    the host on one GPU (NCCL refuses them: "Duplicate GPU detected"; gloo stages their messages through the CPU).
    ``who``: how the error names the process (default "process <local_rank>")."""
    who = who or f"process {local_rank}"
    if not 0 <= local_rank < local_world:
        raise ValidationError(f"{who}: local rank {local_rank} is not one of the host's {local_world} processes")
    if gpus < 0:
        raise ValidationError(f"{who}: {gpus} GPUs is not a number of GPUs")
    name = "cpu" if device is None else str(device)
    if name == "auto":
        name = "cuda" if gpus else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValidationError(f"{who}: device {name!r} is not a device (\"cpu\", \"cuda\", \"cuda:N\" or "
                              "\"auto\")") from None
    if dev.type == "cpu":
        if transport == "nccl":
            raise ValidationError(f"{who}: runtime.transport = \"nccl\" moves tensors between GPUs, and device is "
                                  f"{str(device)!r}: use transport = \"gloo\" on the CPU, or device = \"cuda\"")
        return dev
    if dev.type != "cuda":
        raise ValidationError(f"{who}: device {name!r}: the distributed runtime runs on \"cpu\" or \"cuda\"")
    if gpus == 0:
        raise ValidationError(f"{who}: device {name!r} asked for, but this process sees no CUDA device (torch "
                              f"{torch.__version__}, CUDA {torch.version.cuda or 'not built in'}; check the driver "
                              "and CUDA_VISIBLE_DEVICES on this host), or use device = \"cpu\"")
    if dev.index is not None:
        if dev.index >= gpus:
            raise ValidationError(f"{who}: device {name!r}, but this host shows {gpus} GPU"
                                  f"{'s' if gpus != 1 else ''} (cuda:0 … cuda:{gpus - 1})")
        index, sharing = dev.index, local_world
    else:
        index = local_rank % gpus
        sharing = len(range(index, local_world, gpus))  # the host's processes r with r mod G = index
    if transport == "nccl" and sharing > 1:
        raise ValidationError(f"{who}: runtime.transport = \"nccl\" needs one GPU per process: {local_world} "
                              f"processes, {gpus} GPU{'s' if gpus != 1 else ''} here, {sharing} of them on cuda:"
                              f"{index} (device {name!r}); NCCL refuses two processes on one GPU "
                              f"(\"{NCCL_SHARED}\"). Use transport = \"gloo\" (messages staged through the CPU), "
                              "or at most one process per GPU")
    return torch.device("cuda", index)


def check_transport(runtime: RuntimeSpec | dict, procs: int, gpus: int | None = None,
                    device: str | None = "cuda") -> None:
    """Refuse a transport this machine cannot give its ``procs`` processes running on ``device``: NCCL moves GPU
    tensors only, needs one GPU per process (it refuses two ranks on one GPU: "Duplicate GPU detected";
    :func:`privdl.device.process_device` places the processes), and is not built — the runtime moves its messages
    with gloo, GPU tensors staged through the CPU (docs/backends.md, "On GPUs", says why). ``runtime``: the run's
    :class:`~privdl.runtime_spec.RuntimeSpec`, or its ``[runtime]`` table; ``gpus``: the GPUs this machine shows
    (default: torch's count)."""
    if isinstance(runtime, dict):
        runtime = RuntimeSpec.of_table(runtime)
    if runtime.transport != "nccl":
        return
    gpus = visible_gpus() if gpus is None else gpus
    for r in range(procs):
        process_device(device, local_rank=r, local_world=procs, gpus=gpus, transport="nccl",
                       who=f"process {r} of {procs}")
    raise PrivdlError("runtime.transport = \"nccl\" is not built yet: the runtime's messages go over gloo, which "
                      "carries tensors of runs on a GPU through the CPU; set transport = \"gloo\"")


__all__ = ["NCCL_SHARED", "check_transport", "process_device", "resolve_device", "visible_gpus"]
