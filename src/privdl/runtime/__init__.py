"""The distributed runtime: the simulator's algorithm and mechanism code, each process holding a slice of the
agents, on torch.distributed (gloo point-to-point). ``privdl run CONFIG --procs K`` on one machine; on several
hosts ``torchrun --nnodes H --node-rank h --nproc-per-node k --master-addr A --master-port P -m privdl.runtime
CONFIG --out DIR``. docs/ARCHITECTURE.md, "The distributed runtime"."""

from privdl.runtime.launch import launch
from privdl.runtime.transport import DistTransport

__all__ = ["DistTransport", "launch"]
