"""Networks: topologies, mixing rules, validation, spectral facts, edges in canonical order (SPEC §1)."""

from privdl.network.edges import Edges, adjacency, directed_edges, fingerprint, laplacian, undirected_edges
from privdl.network.mixing import MIXING_RULES, lazy, mixing_matrix
from privdl.network.network import (
    Network,
    erdos_renyi_with_normalized_fiedler,
    fiedler_value,
    load_network_file,
)
from privdl.network.topology import TOPOLOGIES, make_graph
from privdl.network.directed import DirectedNetwork, is_directed  # (registers the directed topologies)
from privdl.network.validation import validate_mixing_matrix

__all__ = [
    "MIXING_RULES", "TOPOLOGIES", "DirectedNetwork", "Edges", "Network", "adjacency", "directed_edges", "fingerprint",
    "laplacian", "undirected_edges", "erdos_renyi_with_normalized_fiedler", "fiedler_value", "is_directed", "lazy",
    "load_network_file", "make_graph", "mixing_matrix", "validate_mixing_matrix",
]
