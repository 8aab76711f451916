"""Ready-made reproductions of the source papers' results (``privdl reproduce NAME``): packaged configs run through
the ordinary runner, plus the papers' numbers and a thin comparison."""

from privdl.reproductions import (  # noqa: F401  (register)
    attacks, corn, designs, dp_dec, dpdl, neighbourhood_bound, noise_linearity, rms, rms_remarks,
)
from privdl.reproductions.common import REPRODUCTIONS, packaged_config, parallel

__all__ = ["REPRODUCTIONS", "packaged_config", "parallel"]
