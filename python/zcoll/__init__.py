"""zcoll: compiled collective communication over MPI for distributed training.

Subpackages by concern; each imports only those before it (tests/test_layers.py checks):
``core`` (the Communicator over the extension _C), ``compression`` (codecs), ``observe``
(traces, flight records, probes, step reports, metrics), ``tune`` (cost models and
``compression="auto"``), ``torch`` (the process group, hooks), ``tools`` (the ``zcoll`` command).

    import zcoll
    comm = zcoll.Communicator()             # MPI.COMM_WORLD, duplicated
    comm.allreduce(grad, op="avg", out=grad)
    q = zcoll.GradientQuantizer(bits=8)     # compressed: int8 codes + scales on the wire
    comm.allreduce(grad, op="avg", out=grad, compression=q, key="grad")
"""

from . import _C
from ._C import BrokenError, MismatchError, RankLostError, TimeoutError, ZcollError
from .compression import (
    CompressionStats,
    Compressor,
    GradientQuantizer,
    HalfPrecision,
    Payload,
    RandomK,
    Threshold,
    TopK,
)
from .core import ALGORITHMS, OPS, Communicator
from .tune import AutoCompression

__version__ = _C.__version__


def choose_algorithm(
    nbytes: int,
    ranks: int,
    *,
    shared_memory: bool = True,
    oversubscribed: bool = False,
    node_hierarchy: bool = False,
    ordered_ring_gain: float = 1.0,
    nodes: int = 0,
    node_link_ratio: float = 0.0,
    slow_node_factor: float = 0.0,
) -> str:
    """The allreduce algorithm ``algorithm="auto"`` picks for a message of `nbytes` on `ranks`.

    shared_memory: every rank on one node; oversubscribed: more ranks than cores on a node
    (then MPI's own collectives busy-spin and are never picked); node_hierarchy: several nodes
    with the same number (> 1) of ranks each; ordered_ring_gain: how many times faster the
    slowest hop of the measured best ring order is than rank order's (Communicator.ring_gain);
    nodes: how many nodes with node_hierarchy (0: not known, answered as for few nodes);
    node_link_ratio: median bandwidth within a node over that between nodes, as a probe
    (ZCOLL_TOPOLOGY) measured it (0: not known; below 2, hierarchical is not picked on 2 nodes);
    slow_node_factor: the median bandwidth between nodes over the slowest node's, as a probe
    measured it (Communicator.slow_node_factor; 0: not known): from 3 nodes, halving-doubling
    gives way to hierarchical at a crossover that falls by this factor."""
    return _C.choose_allreduce_algorithm(
        nbytes,
        ranks,
        not oversubscribed,
        shared_memory,
        oversubscribed,
        node_hierarchy,
        ordered_ring_gain,
        nodes,
        node_link_ratio,
        slow_node_factor,
    )


def dump(reason: str = "zcoll.dump()") -> list:
    """Writes the flight recorder of every live communicator of this process (its last
    ``ZCOLL_FLIGHT_RECORDER`` collectives: sequence number, collective, size, algorithm, state
    and per-peer progress) to ``ZCOLL_DUMP_DIR`` as ``zcoll-flight-<comm>-rank<R>.json``;
    returns the paths. Not collective: call it on the ranks you want to see (SIGUSR1 does the
    same). ``zcoll report DIR`` lines the ranks' dumps up and says where they diverged."""
    return _C.dump_all(reason)


def block_range(count: int, ranks: int, rank: int) -> range:
    """The element range reduce_scatter leaves on `rank`."""
    begin = _C.block_begin(count, ranks, rank)
    return range(begin, begin + _C.block_count(count, ranks, rank))


__all__ = [
    "ALGORITHMS",
    "AutoCompression",
    "BrokenError",
    "OPS",
    "Communicator",
    "CompressionStats",
    "Compressor",
    "GradientQuantizer",
    "HalfPrecision",
    "MismatchError",
    "Payload",
    "RandomK",
    "RankLostError",
    "Threshold",
    "TimeoutError",
    "TopK",
    "ZcollError",
    "__version__",
    "block_range",
    "choose_algorithm",
    "dump",
]
