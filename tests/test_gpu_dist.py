"""The distributed runtime on GPUs, as far as a machine without one can check it: which device each process takes
(a pure function of its local rank, the GPUs its host shows and the transport), the refusals (a GPU asked for where
torch sees none, NCCL on a shared GPU or on the CPU, NCCL not built), the worker's placement of its run on its
device (with torch.cuda's answers replaced), the Comm's index tensors moved with it (onto torch's "meta" device,
which exists without CUDA), and the staging of every message through a CPU buffer — the same code on the CPU, where
it must leave the bytes on the wire as they were. The runs on a GPU themselves: benchmarks/gpu_dist_check.py, on a
machine with one (docs/backends.md, "On GPUs")."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from privdl.device import process_device
from privdl.errors import PrivdlError, ValidationError

CONFIG = """name = "gpu"
seeds = [0]
iterations = 4
eval_every = 2
[network]
topology = "ring"
n = 4
sparse = true
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 4
[algorithm]
name = "dsgd"
[mechanism]
name = "none"
[schedule]
eta = 0.1
"""


def _devices(device, k, gpus, transport="gloo"):
    return [str(process_device(device, local_rank=r, local_world=k, gpus=gpus, transport=transport))
            for r in range(k)]


# ---- which device each process takes --------------------------------------------------------------------------------
def test_processes_take_the_host_gpus_round_robin():
    """"cuda": local rank r on a host showing G GPUs takes cuda:(r mod G); "cuda:N": every process GPU N; "auto":
    the GPUs where there are any, else the CPU."""
    assert _devices("cuda", 4, 2) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert _devices("cuda", 3, 1) == ["cuda:0"] * 3
    assert _devices("cuda", 2, 8) == ["cuda:0", "cuda:1"]  # fewer processes than GPUs: the first ones
    assert _devices("cuda:1", 3, 2) == ["cuda:1"] * 3
    assert _devices("auto", 2, 0) == ["cpu", "cpu"]
    assert _devices("auto", 3, 2) == ["cuda:0", "cuda:1", "cuda:0"]
    assert _devices("cpu", 2, 4) == ["cpu", "cpu"]
    assert _devices(None, 1, 0) == ["cpu"]


@pytest.mark.parametrize("k", range(1, 10))
@pytest.mark.parametrize("gpus", range(1, 5))
def test_every_gpu_carries_its_share_of_the_processes(k, gpus):
    """With gloo every process gets a GPU, the GPUs in use are the first min(k, G), and no GPU carries more than
    ⌈k/G⌉ processes nor one more than another."""
    got = _devices("cuda", k, gpus)
    counts = np.bincount([int(d.split(":")[1]) for d in got], minlength=gpus)
    assert counts.sum() == k
    assert (counts[:min(k, gpus)] > 0).all() and counts.max() == -(-k // gpus)
    assert counts.max() - counts[:min(k, gpus)].min() <= 1


def test_nccl_takes_one_gpu_per_process_and_refuses_a_shared_one():
    """NCCL refuses two processes on one GPU ("Duplicate GPU detected"): with 3 processes on 2 GPUs, processes 0
    and 2 would share cuda:0 (refused, naming both counts) while process 1 is alone on cuda:1; NCCL on the CPU and a
    GPU where none is seen are refused by reason."""
    assert _devices("cuda", 2, 2, "nccl") == ["cuda:0", "cuda:1"]
    with pytest.raises(ValidationError, match=r"process 0: .*needs one GPU per process: 3 processes, 2 GPUs here, "
                                              r"2 of them on cuda:0.*Duplicate GPU detected.*transport = \"gloo\""):
        process_device("cuda", local_rank=0, local_world=3, gpus=2, transport="nccl")
    assert str(process_device("cuda", local_rank=1, local_world=3, gpus=2, transport="nccl")) == "cuda:1"
    with pytest.raises(ValidationError, match="2 of them on cuda:1"):
        process_device("cuda:1", local_rank=0, local_world=2, gpus=4, transport="nccl")
    with pytest.raises(ValidationError, match="moves tensors between GPUs"):
        process_device("cpu", local_rank=0, local_world=1, gpus=1, transport="nccl")
    with pytest.raises(ValidationError, match="moves tensors between GPUs"):
        process_device("auto", local_rank=0, local_world=1, gpus=0, transport="nccl")


def test_a_gpu_that_is_not_there_is_refused_by_reason():
    with pytest.raises(ValidationError, match=r"process 1: device 'cuda' asked for, but this process sees no CUDA "
                                              r"device .*CUDA_VISIBLE_DEVICES"):
        process_device("cuda", local_rank=1, local_world=2, gpus=0)
    with pytest.raises(ValidationError, match=r"device 'cuda:2', but this host shows 2 GPUs \(cuda:0 … cuda:1\)"):
        process_device("cuda:2", local_rank=0, local_world=1, gpus=2)
    with pytest.raises(ValidationError, match="runs on \"cpu\" or \"cuda\""):
        process_device("meta", local_rank=0, local_world=1, gpus=1)
    with pytest.raises(ValidationError, match="local rank 2 is not one of the host's 2 processes"):
        process_device("cuda", local_rank=2, local_world=2, gpus=1)


# ---- the launcher and the worker -------------------------------------------------------------------------------------
def _fake_gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_the_launcher_refuses_what_the_processes_cannot_have_before_starting_them(tmp_path, monkeypatch):
    """`privdl run --procs K` checks every run's device on this machine before any process starts: here (a CPU
    build of torch) "cuda" is refused; with torch.cuda answering 1 GPU, NCCL for 2 processes is refused as a shared
    GPU, and with 2 GPUs as not built. The error names the run."""
    from privdl.runtime import launch

    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    started = time.perf_counter()
    if not torch.cuda.is_available():
        with pytest.raises(ValidationError, match=r"run .*process 0 of 2: device 'cuda' asked for, but this process "
                                                  r"sees no CUDA device"):
            launch(cfg, procs=2, out=tmp_path / "o", overrides=["device=\"cuda\""])
    _fake_gpus(monkeypatch, 1)
    with pytest.raises(ValidationError, match="needs one GPU per process: 2 processes, 1 GPU here"):
        launch(cfg, procs=2, out=tmp_path / "o", overrides=["device=\"cuda\"", "runtime.transport=\"nccl\"",
                                                            "runtime.backend=\"dist\""])
    _fake_gpus(monkeypatch, 2)
    with pytest.raises(PrivdlError, match="nccl\" is not built yet"):
        launch(cfg, procs=2, out=tmp_path / "o", overrides=["device=\"cuda\"", "runtime.transport=\"nccl\"",
                                                            "runtime.backend=\"dist\""])
    assert time.perf_counter() - started < 30  # refused in the launcher: no worker was started
    assert not (tmp_path / "o").exists()



def test_a_task_that_runs_on_the_cpu_only_is_refused_before_any_process_starts(tmp_path, monkeypatch):
    """With GPUs (torch.cuda answering 2), a run whose task cannot move to one (the quadratic task keeps the CPU-only
    Task.to) is refused by the launch check, naming the run and the task — not at the task's first move inside the
    workers, after they claimed the output folder; a task that moves (logistic regression) passes the check."""
    from privdl.experiment import load_config
    from privdl.runtime.launch import check_devices

    _fake_gpus(monkeypatch, 2)
    ok = tmp_path / "ok.toml"
    ok.write_text(CONFIG)
    check_devices(load_config(ok, ["device=\"cuda\""]), 2)
    cpu_only = tmp_path / "q.toml"
    cpu_only.write_text(CONFIG.replace('name = "logistic"\ndataset = "breast_cancer"\nbatch_size = 4',
                                       'name = "quadratic"'))
    with pytest.raises(ValidationError, match=r"run .*task 'quadratic' runs on the CPU only \(asked for device "
                                              r"'cuda'\)"):
        check_devices(load_config(cpu_only, ["device=\"cuda\""]), 2)
    check_devices(load_config(cpu_only, []), 2)  # on the CPU it runs

def test_a_worker_takes_its_device_from_its_place_on_the_host(monkeypatch):
    """A worker reads its place on the host from LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun's; privdl's launcher
    sets them too), else from its rank: the 4th of 4 processes on a host showing 2 GPUs runs on cuda:1; with no
    GPU it is refused naming the process."""
    from privdl.runtime.worker import host_place, run_device

    assert host_place(5, 8, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}) == (1, 4)
    assert host_place(5, 8, {}) == (5, 8)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    cfg = {"device": "cuda", "runtime": {"backend": "dist"}}
    _fake_gpus(monkeypatch, 2)
    assert run_device(cfg, 7, 8) == torch.device("cuda", 1)
    assert run_device({"runtime": {}}, 7, 8) == torch.device("cpu")
    nccl = {"device": "cuda", "runtime": {"transport": "nccl"}}
    with pytest.raises(ValidationError, match="process 7 of 8: .*4 processes, 2 GPUs here, 2 of them on cuda:1"):
        run_device(nccl, 7, 8)  # 4 processes on 2 GPUs: shared
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(PrivdlError, match="not built yet"):
        run_device(nccl, 7, 8)  # one process per GPU: not built
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    _fake_gpus(monkeypatch, 0)
    with pytest.raises(ValidationError, match="process 7 of 8: device 'cuda' asked for, but this process sees no"):
        run_device(cfg, 7, 8)


class _Moved:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def to(self, device):
        self.log.append((self.name, str(device)))
        return self


def test_the_worker_puts_its_run_on_its_device(monkeypatch):
    """On a GPU the worker makes it the process's current device and moves the whole task (the coordinator's
    evaluation) and the engine's held task there; on the CPU nothing moves."""
    from privdl.runtime.worker import place_on

    log = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: log.append(("current", str(d))))
    held = _Moved(log, "held")
    assert place_on(torch.device("cpu"), _Moved(log, "task"), held) is held and log == []
    assert place_on(torch.device("cuda", 1), _Moved(log, "task"), held) is held
    assert log == [("current", "cuda:1"), ("task", "cuda:1"), ("held", "cuda:1")]


def test_a_restricted_task_moves_to_a_device():
    """The engine's task is restricted to its agents on the CPU, then moved: a restricted supervised task (no
    training-evaluation set) moves without error, its agents' examples with it ("meta": a device without CUDA)."""
    from privdl.experiment import load_config
    from privdl.experiment.build import build
    from privdl.experiment.config import expand
    from privdl.placement import partition
    from privdl.tasks.held import HeldTask

    c = build(expand(load_config(_write(CONFIG)))[0][0].config)
    held = HeldTask(c.task, partition(4, slices=2)[1])
    held.to("meta")
    assert held.X.device.type == "meta" and held.X_test.device.type == "meta" and held.X.shape[0] == 2
    assert held.X_train_eval is None and c.task.X.device.type == "cpu"


def _write(text):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "c.toml"
    path.write_text(text)
    return path


# ---- the Comm's indices ----------------------------------------------------------------------------------------------
def _cpu_tensors(comm):
    """The names of the comm's tensor attributes (and dicts of tensors) still on the CPU."""
    out = set()
    for name, value in vars(comm).items():
        values = value.values() if isinstance(value, dict) else [value]
        if any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values):
            out.add(name)
    return out


@pytest.mark.parametrize("held", [False, True])
def test_a_slice_comm_moves_every_index_it_plans_with_its_edges(held):
    """comm.to(device) (what run_slice does for a process on a GPU) moves the edges and every index tensor of the
    plan — the kernels index the rows with them on the device —, leaving on the CPU only what is moved where it is
    used (the row mask, the held frame's local rows and the CPU table its per-edge plan is built from); a re-plan (a
    time-varying graph's round) moves the new plan."""
    from privdl.comm.held import HeldComm
    from privdl.comm.sliced import SliceComm
    from privdl.comm.transport import Transport
    from privdl.experiment.build import build_network
    from privdl.placement import partition
    from privdl.simulator.sliced import owners_of

    net = build_network({"topology": "erdos_renyi", "n": 7, "p": 0.5, "seed": 1}, 0)
    parts = partition(7, slices=3)
    owner = owners_of(parts, 7)
    kind = HeldComm if held else SliceComm
    comm = kind(net, parts[1], 1, owner, Transport(3))
    before = _cpu_tensors(comm)
    assert {"rows_out", "position", "read_rows", "mine_in"} <= before
    comm.to("meta")
    left = {"row_mask"} | ({"local_out", "_local"} if held else set())
    assert _cpu_tensors(comm) == left
    assert comm.edges.src.device.type == "meta" and comm.held_order.edge.device.type == "meta"
    comm._set_edges(net.edges)  # a re-plan (on a GPU the round's edges are there; "meta" holds no numbers to plan)
    assert _cpu_tensors(comm) == left and comm.position.device.type == "meta"


def test_the_held_per_edge_plan_is_moved_once_per_device_and_edge_set():
    """The held frame's per-edge methods (pull, push, send, reduce) index with the per-edge plan on the values'
    device: moved there once per edge set and device (every tensor of it on that device), not on every call; a new
    edge set (a time-varying graph's round) gets its own."""
    from privdl.comm.held import HeldComm
    from privdl.comm.transport import Transport
    from privdl.experiment.build import build_network
    from privdl.placement import partition
    from privdl.simulator.sliced import owners_of

    net = build_network({"topology": "erdos_renyi", "n": 7, "p": 0.5, "seed": 1}, 0)
    parts = partition(7, slices=3)
    comm = HeldComm(net, parts[1], 1, owners_of(parts, 7), Transport(3))
    meta = torch.device("meta")
    moved = comm._edges_on(meta)
    tensors = [t for v in moved.values() for t in (v.values() if isinstance(v, dict) else [v])]
    assert {"read_at", "received", "at_received", "local_at", "in_at", "out_sent"} <= set(moved)
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert comm._edges_on(meta) is moved  # the second call moves nothing
    assert comm._edges_on(torch.device("cpu")) is not moved
    comm._set_edges(build_network({"topology": "erdos_renyi", "n": 7, "p": 0.5, "seed": 2}, 0).edges)
    assert comm._edges_on(meta) is not moved


# ---- staging through the CPU ----------------------------------------------------------------------------------------
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
def test_staging_leaves_the_bytes_on_the_wire_as_they_were(dtype):
    """A message is the header's 128 bytes then the payload's, in a CPU buffer: the bytes gloo sends are those of
    the header and the (contiguous) payload, for every dtype, a non-contiguous payload and an empty one."""
    from privdl.runtime.transport import HEADER, Staging, encode

    g = torch.Generator().manual_seed(3)
    value = (torch.randn(5, 4, generator=g, dtype=torch.float64) * 50).to(dtype).t()  # non-contiguous
    h = encode((3, "theta", 1, str(dtype), tuple(value.shape)))
    stage = Staging("cpu")
    message = stage.message(h, value)
    want = h.numpy().tobytes() + value.contiguous().numpy().tobytes() if dtype != torch.bfloat16 else \
        h.numpy().tobytes() + value.contiguous().view(torch.int16).numpy().tobytes()
    assert message.device.type == "cpu" and message.dtype == torch.uint8
    assert message.numpy().tobytes() == want
    back = stage.payload(message[HEADER * 8:], dtype, tuple(value.shape), "payload")
    assert torch.equal(back, value)
    for kind in ("payload", "control"):  # the bytes as a numpy view (what DistTransport hands a CPU process)
        back = stage.payload(message.numpy()[HEADER * 8:], dtype, tuple(value.shape), kind)
        assert back.dtype == dtype and torch.equal(back, value)
    assert stage.message(h, value[:0]).numel() == HEADER * 8
    assert stage.sent == stage.received == 0  # nothing crossed a device


def test_received_payloads_go_to_the_device_and_control_stays_on_the_cpu():
    """On a process with a device, a received payload (the agents' rows) is copied onto it; the coordinator's and
    key agreement's messages (control, setup) stay on the CPU, where they are read as numbers ("meta" stands for the
    GPU: a device torch has without CUDA)."""
    from privdl.runtime.transport import Staging

    stage = Staging("meta")
    data = torch.arange(24, dtype=torch.uint8)
    got = stage.payload(data, torch.float64, (3,), "payload")
    assert got.device.type == "meta" and got.shape == (3,) and got.dtype == torch.float64
    assert stage.received == 24
    for kind in ("control", "setup"):
        got = stage.payload(data, torch.int64, (3,), kind)
        assert got.device.type == "cpu" and got.tolist() == data.view(torch.int64).tolist()
    assert stage.received == 24 and not stage.pin  # pinned buffers only for a CUDA device
    got = stage.payload(data.numpy(), torch.float64, (3,), "payload")  # a numpy view of the bytes, too
    assert got.device.type == "meta" and got.shape == (3,) and stage.received == 48
    got = stage.payload(data.numpy(), torch.int64, (3,), "control")
    assert got.device.type == "cpu" and got.tolist() == data.view(torch.int64).tolist()


def test_reused_send_buffers_carry_each_message_as_sent(monkeypatch):
    """DistTransport.send reuses a (receiver, tag, dtype, shape)'s buffer once its send completed: every message
    still leaves with its own header and payload bytes — read when gloo would send them (at the wait), so a buffer
    reused while a send is in flight would show the later message's bytes — and a payload of another dtype or
    shape under the same header key goes out as its own bytes."""
    import privdl.runtime.transport as T

    seen = []

    class Done:
        def __init__(self, message):
            self.message = message

        def wait(self):
            seen.append(self.message.numpy().tobytes())

    class Loopback:
        def isend(self, message, dst):
            return Done(message)

    monkeypatch.setattr(T, "dist", Loopback())
    t = T.DistTransport(0, 3, [(0,), (1,), (2,)], timeout=10)
    want = []
    for r in range(3):
        for seq, dst in ((0, 1), (1, 1), (2, 2)):  # two sends to peer 1 in flight together, same key
            value = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1) + seq
            header = (r, "theta", seq, "torch.float32", (2, 3))
            t.send(0, dst, header, value)
            want.append(T.encode(header).numpy().tobytes() + value.numpy().tobytes())
        t.flush(0)
    odd = torch.arange(6, dtype=torch.float64)  # neither the header's dtype nor its shape
    header = (3, "theta", 0, "torch.float32", (2, 3))
    t.send(0, 1, header, odd)
    t.flush(0)
    assert seen == want + [T.encode(header).numpy().tobytes() + odd.numpy().tobytes()]
    assert t.payload_bytes.tolist() == [0, 3 * 24 * 2 + 48, 3 * 24]


def _staged_pair(rank, port, out):
    import datetime

    import torch.distributed as dist

    from privdl.runtime.transport import DistTransport, Staging

    class Counted(Staging):
        def payload(self, data, dtype, shape, kind):
            self.kinds.append(kind)
            return super().payload(data, dtype, shape, kind)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=10))
    t = DistTransport(rank, 2, [(0,), (1,)], timeout=10, device="cpu")
    t.staging = Counted("cpu")
    t.staging.kinds = []
    mine = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * rank
    other = 1 - rank
    got = t.exchange(rank, [(other, (0, "theta", 0, "torch.float32", (2, 3)), mine)],
                     [(other, (0, "theta", 0, "torch.float32", (2, 3)))])
    gathered = t.gather(rank, 0, "privdl/record", mine.double(), [(2, 3), (2, 3)])
    out.put((rank, got[other].tolist(), None if gathered is None else [g.tolist() for g in gathered],
             t.staging.kinds))
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_received_message_goes_through_the_staging_with_its_kind():
    """Two processes on gloo: the exchange's payload and the coordinator's gather arrive whole, and every received
    message passed through the process's Staging — the payload as "payload" (copied to the device on a GPU), the
    gather as "control" (kept on the CPU)."""
    import torch.multiprocessing as mp

    from privdl.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_staged_pair, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    got = dict((r, rest) for r, *rest in (out.get(), out.get()))
    for rank in (0, 1):
        rows, gathered, kinds = got[rank]
        assert rows == (torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * (1 - rank)).tolist()
        assert kinds == (["payload", "control"] if rank == 0 else ["payload"])
    assert got[0][1] == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]]]
