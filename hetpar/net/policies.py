"""hetpar's own collective algorithms, which a cluster's ``collectives`` policy adds to NCCL's
choices: each registers itself with the policies that try it, and the simulator prices a
communicator with the cheapest registered one (``best``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, get_args

from hetpar.net import collectives as algo
from hetpar.net.collectives import Level, Op, Path
from hetpar.specs.cluster import CollectiveSet


class Communicator(Protocol):
    """How a communicator sits on the network (``sim.network.GroupShape`` is one)."""

    @property
    def levels(self) -> tuple[Level, ...]:
        """The hierarchy the ranks cross, innermost first."""

    @property
    def alternatives(self) -> tuple[tuple[Level, ...], ...]:
        """Hierarchies over parallel paths (a split may use them together)."""

    @property
    def inners(self) -> tuple[Path, ...]:
        """The inner path of each node group, when the ranks span several."""


Cost = Callable[[Communicator, Op, float], float]
"""``(communicator, op, bytes) -> seconds``; math.inf where the algorithm does not apply."""


@dataclass(frozen=True, kw_only=True)
class PolicyAlgorithm:
    """One of hetpar's algorithms and the cluster ``collectives`` settings that try it."""

    name: str
    policies: frozenset[str]
    cost: Cost


_REGISTRY: dict[str, PolicyAlgorithm] = {}


def register(name: str, policies: Iterable[CollectiveSet] = ("hierarchical", "best")
             ) -> Callable[[Cost], Cost]:
    """Decorator registering a cost function as algorithm ``name`` under ``policies``."""
    chosen = frozenset(policies)
    assert chosen <= set(get_args(CollectiveSet)) - {"nccl"}, (name, chosen)

    def deco(fn: Cost) -> Cost:
        assert name not in _REGISTRY, f"collective algorithm {name!r} registered twice"
        _REGISTRY[name] = PolicyAlgorithm(name=name, policies=chosen, cost=fn)
        return fn

    return deco


def unregister(name: str) -> None:
    """Remove a registered algorithm (for tests and plug-ins that register temporarily)."""
    del _REGISTRY[name]


def candidates(policy: str) -> tuple[PolicyAlgorithm, ...]:
    """The registered algorithms that ``policy`` tries, in registration order."""
    return tuple(a for a in _REGISTRY.values() if policy in a.policies)


def best(comm: Communicator, policy: str, op: Op, nbytes: float) -> float:
    """The cheapest algorithm ``policy`` tries for ``comm`` (inf when none applies)."""
    return min((a.cost(comm, op, nbytes) for a in candidates(policy)), default=math.inf)


@register("hierarchical")
def _hierarchical(comm: Communicator, op: Op, nbytes: float) -> float:
    """Level by level (``collectives.hierarchical``: Jia et al. 2018, 2D all-reduce)."""
    return algo.hierarchical(comm.levels, op, nbytes)


@register("type-first")
def _type_first(comm: Communicator, op: Op, nbytes: float) -> float:
    """Reduce-scatter inside each GPU type at its own speed (concurrently), only the shards
    cross the slow link, then all-gather inside each type (the same decomposition as
    Jia et al. 2018 across node groups): for ranks spanning several groups on two levels."""
    if len(comm.inners) <= 1 or len(comm.levels) != 2:
        return math.inf
    k, outer = comm.levels[0].size, comm.levels[1]
    inside = max(algo.nccl([Level(k, p)], op, nbytes) for p in comm.inners)
    return inside + algo.nccl([outer], op, nbytes / k)


@register("split", policies=("best",))
def _split(comm: Communicator, op: Op, nbytes: float) -> float:
    """The bytes split over parallel paths so all finish together (``collectives.split``),
    each path priced with the cheaper of NCCL and hierarchical on it."""
    if not comm.alternatives:
        return math.inf
    paths = (comm.levels, *comm.alternatives)
    return algo.split([_single(lv, op) for lv in paths], nbytes)


def _single(levels: tuple[Level, ...], op: Op) -> Callable[[float], float]:
    return lambda x: min(algo.nccl(levels, op, x), algo.hierarchical(levels, op, x))


def level_bytes(cost: Callable[[tuple[Level, ...], Op, float], float],
                levels: tuple[Level, ...], op: Op, nbytes: float) -> tuple[float, ...]:
    """Bytes per rank that ``cost`` (a ``collectives`` algorithm) prices on each level.

    Read off the price itself: with level j at 1 byte/s, every other level free and no
    latency, the seconds it charges are the bytes one rank sends over level j. Tests compare
    this with the bytes the runtime moves (``runtime.hiersync``).
    """
    free = Path("free", math.inf, 0.0)
    out = []
    for j, lv in enumerate(levels):
        probe = tuple(Level(x.size, Path("unit", 1.0, 0.0) if i == j else free)
                      for i, x in enumerate(levels))
        out.append(cost(probe, op, nbytes) if lv.size > 1 else 0.0)
    return tuple(out)
