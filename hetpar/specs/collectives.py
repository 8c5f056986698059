"""How a plan's collectives run (NCCL algorithm, protocol, DP sync); alternative network models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError

Algorithm = Literal["auto", "ring", "tree"]
NcclProtocol = Literal["auto", "LL", "LL128", "Simple"]
DpSync = Literal["auto", "flat", "hierarchical"]
ALGORITHMS: tuple[Algorithm, ...] = ("auto", "ring", "tree")
PROTOCOLS: tuple[NcclProtocol, ...] = ("auto", "LL", "LL128", "Simple")
DP_SYNCS: tuple[DpSync, ...] = ("auto", "flat", "hierarchical")

NCCL_ALGO = {"ring": "Ring", "tree": "allreduce:tree"}
"""``NCCL_ALGO`` per forced algorithm. NCCL's tree implements all-reduce only: a global
``NCCL_ALGO=Tree`` leaves all-gather / reduce-scatter / broadcast with no algorithm ("no
algorithm/protocol available", NVIDIA/nccl issue #317), so the tree is forced for all-reduce
alone with the per-collective form (NCCL >= 2.24) and the tuner keeps choosing the others."""


def _check(name: str, value: str, allowed: tuple[str, ...], where: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: {name} {value!r} unknown; allowed: {', '.join(allowed)}")


@dataclass(frozen=True, kw_only=True)
class Collectives:
    """What a plan forces on its collectives; ``auto`` leaves the choice to the library.

    ``algorithm``: NCCL's ring for every collective, or its double binary tree for the
    all-reduces (``NCCL_ALGO``; the tree has no all-gather / reduce-scatter).
    ``protocol``: NCCL's LL, LL128 or Simple (``NCCL_PROTO``).
    ``dp_sync``: a communicator that spans nodes as one flat NCCL call (``flat``), or inside
    the nodes first and only the shards across them (``hierarchical``: Jia et al. 2018, 2D
    all-reduce; hybrid sharding in the frameworks); ``auto``: the cluster's ``collectives``.
    """

    algorithm: Algorithm = "auto"
    protocol: NcclProtocol = "auto"
    dp_sync: DpSync = "auto"

    def __post_init__(self) -> None:
        _check("algorithm", self.algorithm, ALGORITHMS, "plan.collectives")
        _check("protocol", self.protocol, PROTOCOLS, "plan.collectives")
        _check("dp_sync", self.dp_sync, DP_SYNCS, "plan.collectives")

    @property
    def is_auto(self) -> bool:
        return (self.algorithm, self.protocol, self.dp_sync) == ("auto", "auto", "auto")

    def env(self) -> dict[str, str]:
        """The NCCL environment variables that force the choice (none for ``auto``)."""
        out = {}
        if self.algorithm != "auto":
            out["NCCL_ALGO"] = NCCL_ALGO[self.algorithm]
        if self.protocol != "auto":
            out["NCCL_PROTO"] = self.protocol
        return out

    def label(self) -> str:
        """Short text naming what is forced (``auto`` when nothing is)."""
        parts = [v for v in (self.algorithm, self.protocol, self.dp_sync) if v != "auto"]
        return "+".join(parts) or "auto"


AUTO = Collectives()


@dataclass(frozen=True, kw_only=True)
class NetworkModel:
    """One alternative model of what the fabric does, where the cost model cannot know
    (``--objective robust`` evaluates every plan under each one of a search space's list).

    ``algorithm`` / ``protocol`` / ``dp_sync``: what the library runs where the plan leaves
    it to ``auto`` (a plan's forced choice wins: its environment variables set it).
    ``scale_out_efficiency``: the fraction of the scale-out links' modelled bandwidth achieved
    (e.g. cloud TCP offload, whose achieved bandwidth varies).
    ``ring_per_gpu``: a flat ring in which every GPU's traffic crosses its own share of the
    node's NICs (the per-GPU bandwidth model of peer planners such as Sailor, SOSP'25), instead
    of NCCL's rings, which cross each node boundary once per channel (hetpar.net.nccl).
    """

    name: str
    description: str = ""
    algorithm: Algorithm = "auto"
    protocol: NcclProtocol = "auto"
    dp_sync: DpSync = "auto"
    scale_out_efficiency: float = 1.0
    ring_per_gpu: bool = False

    def __post_init__(self) -> None:
        where = f"network model {self.name!r}"
        _check("algorithm", self.algorithm, ALGORITHMS, where)
        _check("protocol", self.protocol, PROTOCOLS, where)
        _check("dp_sync", self.dp_sync, DP_SYNCS, where)
        if not 0.0 < self.scale_out_efficiency <= 4.0:
            raise ConfigError(f"{where}: scale_out_efficiency must be in (0, 4], got "
                              f"{self.scale_out_efficiency}")


@dataclass(frozen=True, slots=True)
class Applied:
    """What the simulator prices: a plan's choices over a network model's (hashable)."""

    algorithm: str = "auto"
    protocol: str = "auto"
    dp_sync: str = "auto"
    scale_out_efficiency: float = 1.0
    ring_per_gpu: bool = False

    @property
    def nominal(self) -> bool:
        return self == NOMINAL


NOMINAL = Applied()


def applied(plan: Collectives | None, model: NetworkModel | None = None) -> Applied:
    """The plan's forced choices, ``model``'s where the plan says ``auto``."""
    p = plan or AUTO
    m = model or NetworkModel(name="nominal")

    def pick(mine: str, theirs: str) -> str:
        return mine if mine != "auto" else theirs

    return Applied(pick(p.algorithm, m.algorithm), pick(p.protocol, m.protocol),
                   pick(p.dp_sync, m.dp_sync), m.scale_out_efficiency, m.ring_per_gpu)
