"""Hierarchical gradient all-reduce: reduce-scatter inside each node, shards across, gather inside.

The runtime's form of the network layer's ``hierarchical`` algorithm (Jia et al. 2018), moving
the bytes ``net.collectives.hierarchical`` prices: with k ranks of a group on each node, rank i
of every node receives the node's sum of the i-th 1/k shard (reduce-scatter, (k-1)/k of the
bytes per rank on a ring), all-reduces that shard with rank i of every other node (only shards
cross the slow link), and the node gathers its shards back (all-gather, (k-1)/k again): 2(k-1)/k
inside, where an all-reduce inside followed by the gather would move 3(k-1)/k. The result
equals a flat all-reduce up to floating-point summation order.
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
    pad = (-flat.numel()) % k
    buf = torch.cat([flat, flat.new_zeros(pad)]) if pad else flat
    mine = buf.new_empty(buf.numel() // k)
    reduce_scatter(mine, buf, groups.get(inside))
    dist.all_reduce(mine, group=groups.get(parts[1][i]))
    out = buf.new_empty(buf.numel())
    dist.all_gather_into_tensor(out, mine, group=groups.get(inside))
    flat.copy_(out[: flat.numel()])


def reduce_scatter(out: torch.Tensor, buf: torch.Tensor, group: Any, *,
                   native: bool = True) -> None:
    """``out`` = this rank's 1/k shard of ``buf`` summed over the k ranks of ``group``.

    The backend's reduce-scatter where it has one; otherwise (older gloo builds raise on
    ``reduce_scatter_tensor``, or ``native=False``) built from an all-to-all of the shards
    and a local sum, which sends the same (k-1)/k of the bytes per rank as a ring.
    """
    if native:
        try:
            dist.reduce_scatter_tensor(out, buf, group=group)
            return
        except dist.DistBackendError:
            raise  # a failure of the collective itself (timeout, lost peer), not a missing op
        except (RuntimeError, NotImplementedError):
            pass  # no reduce-scatter on this backend: build it from all-to-all
    got = torch.empty_like(buf)
    dist.all_to_all_single(got, buf.contiguous(), group=group)
    torch.sum(got.view(-1, out.numel()), dim=0, out=out)
