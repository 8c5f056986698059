"""Hierarchical gradient all-reduce: inside each node, across nodes on shards, gather inside.

The runtime's form of the network layer's ``hierarchical`` algorithm (Jia et al. 2018): with
k ranks of a group on each node, every node first sums its members' buckets, rank i of each
node then all-reduces the i-th 1/k shard with rank i of every other node (only shards cross
the slow link), and each node gathers its shards back. The result equals a flat all-reduce
up to floating-point summation order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def split(ranks: tuple[int, ...], nodes: tuple[int, ...]
          ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]] | None:
    """(groups inside each node, groups across nodes by local index) for ``ranks``, or None
    when the ranks do not sit k >= 2 per node on >= 2 nodes (a flat all-reduce then)."""
    per: dict[int, list[int]] = {}
    for r in sorted(ranks):
        per.setdefault(nodes[r], []).append(r)
    sizes = {len(v) for v in per.values()}
    if len(per) < 2 or len(sizes) != 1 or sizes.pop() < 2:
        return None
    inside = [tuple(v) for _, v in sorted(per.items())]
    k = len(inside[0])
    across = [tuple(g[i] for g in inside) for i in range(k)]
    return inside, across


def needed_groups(groups: set[tuple[int, ...]], nodes: tuple[int, ...]) -> set[tuple[int, ...]]:
    """The extra process groups the hierarchical form of ``groups`` needs."""
    out: set[tuple[int, ...]] = set()
    for ranks in groups:
        parts = split(ranks, nodes)
        if parts:
            out.update(parts[0])
            out.update(parts[1])
    return out


def all_reduce(flat: torch.Tensor, ranks: tuple[int, ...], nodes: tuple[int, ...],
               groups: Any) -> None:
    """Sum ``flat`` over ``ranks`` in place, hierarchically where the ranks allow it."""
    parts = split(ranks, nodes)
    if parts is None:
        dist.all_reduce(flat, group=groups.get(ranks))
        return
    me = dist.get_rank()
    inside = next(g for g in parts[0] if me in g)
    i = inside.index(me)
    k = len(inside)
    dist.all_reduce(flat, group=groups.get(inside))
    pad = (-flat.numel()) % k
    buf = torch.cat([flat, flat.new_zeros(pad)]) if pad else flat.clone()
    shards = list(buf.chunk(k))
    mine = shards[i].contiguous()
    dist.all_reduce(mine, group=groups.get(parts[1][i]))
    out = [torch.empty_like(mine) for _ in range(k)]
    dist.all_gather(out, mine, group=groups.get(inside))
    flat.copy_(torch.cat(out)[: flat.numel()])
