"""The simulator's cost terms in public, scalar form, for the fast approximations elsewhere.

Replay's ``AnalyticThroughput`` (hetpar.dynamic.cost), the failure studies' ``AnalyticCost``
(hetpar.failures.cost) and the switching cost price collectives and bytes with these, so
there is one ring formula (``hetpar.net.collectives.ring``, the simulator's) and one table
of bytes per element and per parameter (``hetpar.sim.layer.ACT_BYTES``,
``hetpar.sim.memory.state_bytes_per_param``) in the code base.
"""

from __future__ import annotations

from hetpar.net import collectives as algo
from hetpar.net.collectives import Level, Path
from hetpar.sim.layer import ACT_BYTES
from hetpar.sim.memory import state_bytes_per_param

__all__ = ["bytes_per_s", "element_bytes", "ring_all_reduce", "ring_reduce_scatter",
           "ring_traffic", "state_bytes_per_param"]


def element_bytes(precision: str) -> int:
    """Bytes of one activation or gradient element in ``precision`` (the simulator's table)."""
    return ACT_BYTES[precision]


def bytes_per_s(gbps: float) -> float:
    """A link rate in Gbit/s (the file unit) as bytes/s."""
    return gbps * 1e9 / 8


def _plain(ranks: int, bandwidth: float, latency: float) -> list[Level]:
    # kind=None: a plain alpha-beta link, no NCCL protocol choice (hetpar.net.collectives)
    return [Level(ranks, Path("alpha-beta", bandwidth, latency))]


def ring_all_reduce(nbytes: float, ranks: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds of the simulator's ring all-reduce of ``nbytes`` per rank over ``ranks`` on
    one plain link of ``bandwidth`` bytes/s and ``latency`` s per step:
    2 (r-1)/r x bytes / bandwidth + 2 (r-1) x latency (Patarasuk & Yuan 2009)."""
    return algo.ring(_plain(ranks, bandwidth, latency), "all_reduce", nbytes)


def ring_reduce_scatter(nbytes: float, ranks: int, bandwidth: float,
                        latency: float = 0.0) -> float:
    """Seconds of the simulator's ring reduce-scatter (or all-gather: the same cost) of
    ``nbytes`` (the full size): (r-1)/r x bytes / bandwidth + (r-1) x latency."""
    return algo.ring(_plain(ranks, bandwidth, latency), "reduce_scatter", nbytes)


def ring_traffic(op: str, ranks: int) -> float:
    """Bytes each rank sends per byte of data in the simulator's ring: 2 (r-1)/r for an
    all-reduce, (r-1)/r for a reduce-scatter or all-gather (= nccl-tests' bus factor,
    its doc/PERFORMANCE.md)."""
    return algo.ring_lines(_plain(ranks, 1.0, 0.0), op)[0][1]
