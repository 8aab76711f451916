"""The distributed runtime: the simulator's algorithm and mechanism code, each process holding a slice of the
agents, on torch.distributed (gloo point-to-point). ``privdl run CONFIG --procs K`` on one machine; on several
hosts ``torchrun --nnodes H --node-rank h --nproc-per-node k --master-addr A --master-port P -m privdl.runtime
CONFIG --out DIR``. docs/ARCHITECTURE.md, "The distributed runtime"."""

from privdl.runtime.launch import launch

# torch is loaded with the transport, on first use: ``python -m privdl.runtime`` sets privdl's process defaults
# (privdl.process_defaults) before it loads


def __getattr__(name: str) -> object:
    if name == "DistTransport":
        from privdl.runtime.transport import DistTransport

        return DistTransport
    raise AttributeError(f"module 'privdl.runtime' has no attribute {name!r}")


__all__ = ["DistTransport", "launch"]
