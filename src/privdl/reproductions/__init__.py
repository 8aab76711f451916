"""Ready-made reproductions of the source papers' results (``privdl reproduce NAME``)."""

from privdl.reproductions import corn, dp_dec  # noqa: F401  (register)
from privdl.reproductions.common import REPRODUCTIONS

__all__ = ["REPRODUCTIONS"]
