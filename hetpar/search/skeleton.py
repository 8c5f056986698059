"""A plan's skeleton: replica classes of pipeline ranks (node group, tp), and their devices."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from hetpar.placement import block_offsets
from hetpar.search.hashonce import HashOnce

Layout = Literal["dp-inner", "pp-inner"]
"""Keys of ``hetpar.placement.LAYOUTS`` (the device orders they stand for)."""


class Slot(NamedTuple):
    """One pipeline rank: ``tp * cp`` devices of one node group (a tuple: hashed millions
    of times as part of cache keys)."""

    group: str
    tp: int


@dataclass(frozen=True, kw_only=True)
class ReplicaClass(HashOnce):
    """``count`` identical data-parallel replicas with pipeline ranks ``ranks`` (in order)."""

    __hash__ = HashOnce.__hash__

    count: int
    ranks: tuple[Slot, ...]
    layout: Layout = "dp-inner"
    """Device order inside a group (see ``layout_offsets``)."""

    @property
    def pp(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True, kw_only=True)
class Structure(HashOnce):
    """The heterogeneous skeleton of a plan; knobs (micro-batch, schedule...) come on top."""

    __hash__ = HashOnce.__hash__

    family: str
    classes: tuple[ReplicaClass, ...]
    uniform: tuple[int, int, int] | None = None
    """For the ``uniform`` family: (tp, pp, dp) laid over all groups by ``expand``."""
    layout: Layout = "dp-inner"

    @property
    def replicas(self) -> int:
        return sum(c.count for c in self.classes)

    def gpus(self, cp: int) -> dict[str, int]:
        """Devices used per node group."""
        out: dict[str, int] = {}
        for c in self.classes:
            for s in c.ranks:
                out[s.group] = out.get(s.group, 0) + c.count * s.tp * cp
        return out

    def key(self) -> str:
        """A stable, readable identity used to break ties deterministically."""
        parts = [
            f"{c.count}x[" + ",".join(f"{s.group}:tp{s.tp}" for s in c.ranks) + "]"
            for c in self.classes
        ]
        return f"{self.family}:" + "+".join(parts) + ("" if self.layout == "dp-inner" else "|pp-in")


def layout_offsets(classes: Sequence[ReplicaClass], cp: int) -> dict[tuple[int, int, int], int]:
    """First device (inside its group) of rank r of replica i of class ci: a view of the one
    placement (``hetpar.placement.block_offsets``, the ``device_index`` formula of ``expand``).

    ``dp-inner`` (Megatron's tp-cp-dp-pp order): per group, rank blocks in pipeline order,
    the replicas side by side inside a block -- a stage's data-parallel peers are
    neighbours, pipeline hops take the longer links. ``pp-inner`` (tp-cp-pp-dp): each
    replica's ranks side by side -- pipeline hops stay close, gradient sync goes further.
    Which traffic is heavier depends on the model, batch and network, so both are searched.
    """
    return block_offsets([(c.count, [(slot.group, slot.tp * cp) for slot in c.ranks], c.layout)
                          for c in classes])


def with_layouts(s: Structure, layouts: Sequence[str]) -> Iterator[Structure]:
    """``s`` in each layout of ``layouts`` where they differ (pp > 1, replicas > 1)."""
    if "dp-inner" in layouts:
        yield s
    differs = any(c.pp > 1 and c.count > 1 for c in s.classes) or (
        s.uniform is not None and s.uniform[1] > 1 and s.uniform[2] > 1
    )
    if "dp-inner" not in layouts and not differs:
        yield s
    elif "pp-inner" in layouts and differs:
        classes = tuple(replace(c, layout="pp-inner") for c in s.classes)
        yield replace(s, classes=classes, layout="pp-inner")
