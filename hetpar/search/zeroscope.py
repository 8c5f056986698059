"""ZeRO scope per structure: which replicas share a rank's ZeRO group (``Plan.zero_scope``).

The rules mirror ``hetpar.sim.layout``: pipeline rank k's data-parallel peers are rank
``min(k, pp_i - 1)`` of every replica i (``_explicit``); with ``zero_scope = "group"`` a
rank's ZeRO group keeps only the peers on its own node group, and where the peers span
several node groups one rank of each all-reduces its shard across them (``_hybrid``).
"""

from __future__ import annotations

from functools import lru_cache

from hetpar.search.structures import ReplicaClass, Structure


def peer_counts(classes: tuple[ReplicaClass, ...], k: int) -> dict[str, int]:
    """Per node group, how many replicas have pipeline rank ``k``'s peer on it (counted per
    class: a class's replicas all put it on one group)."""
    out: dict[str, int] = {}
    for c in classes:
        if c.count:
            g = c.ranks[min(k, c.pp - 1)].group
            out[g] = out.get(g, 0) + c.count
    return out


@lru_cache(maxsize=65536)
def spans_groups(classes: tuple[ReplicaClass, ...]) -> bool:
    """Whether some rank's data-parallel peers sit on two node groups or more: only then
    does ``zero_scope = "group"`` change the plan (elsewhere ``_hybrid`` keeps every peer
    and adds no cross-group all-reduce, the plan of ``"all"``)."""
    depth = max(c.pp for c in classes)
    return any(len(peer_counts(classes, k)) > 1 for k in range(depth))


@lru_cache(maxsize=65536)
def _degrees(classes: tuple[ReplicaClass, ...], ci: int, scope: str) -> tuple[int, ...]:
    c = classes[ci]
    return tuple(peer_counts(classes, k).get(slot.group, 0) for k, slot in enumerate(c.ranks))


def zero_degrees(s: Structure, ci: int, scope: str) -> tuple[int, ...]:
    """Per pipeline rank of class ``ci``: the replicas its ZeRO stage shards over (all of
    them, or with ``group`` scope those whose peer rank is on the same node group)."""
    if scope != "group":  # the hot path: no hashing of the classes (asked ~10^6 times)
        return (s.replicas,) * s.classes[ci].pp
    return _degrees(s.classes, ci, scope)
