"""Hierarchical gradient all-reduce: reduce-scatter inside each node, shards across, gather inside.

The runtime's form of the network layer's ``hierarchical`` algorithm (Jia et al. 2018), moving
the bytes ``net.collectives.hierarchical`` prices: with k ranks of a group on each node, rank i
of every node receives the node's sum of the i-th 1/k shard (reduce-scatter, (k-1)/k of the
bytes per rank on a ring), all-reduces that shard with rank i of every other node (only shards
cross the slow link), and the node gathers its shards back (all-gather, (k-1)/k again): 2(k-1)/k
inside, where an all-reduce inside followed by the gather would move 3(k-1)/k. The result
equals a flat all-reduce up to floating-point summation order.

ZeRO and FSDP need the two halves alone (``reduce_scatter_over``, ``all_gather_over``):
reduce-scatter inside then across, all-gather across then inside, the level-by-level form
``net.collectives.hierarchical`` prices for those ops. Both keep the flat call's layout (rank
at position p of the sorted ranks owns block p), so callers shard as they would flat.
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
    # sorted, as torch orders a group's members and ``Groups`` keys them
    across = [tuple(sorted(g[i] for g in inside)) for i in range(k)]
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
    dist.all_gather_single(out, mine, group=groups.get(inside))
    flat.copy_(out[: flat.numel()])


def reduce_scatter(out: torch.Tensor, buf: torch.Tensor, group: Any, *,
                   native: bool = True) -> None:
    """``out`` = this rank's 1/k shard of ``buf`` summed over the k ranks of ``group``.

    The backend's reduce-scatter where it has one; otherwise (older gloo builds raise on
    ``reduce_scatter_single``, or ``native=False``) built from an all-to-all of the shards
    and a local sum, which sends the same (k-1)/k of the bytes per rank as a ring.
    """
    if native:
        try:
            dist.reduce_scatter_single(out, buf, group=group)
            return
        except dist.DistBackendError:
            raise  # a failure of the collective itself (timeout, lost peer), not a missing op
        except (RuntimeError, NotImplementedError):
            pass  # no reduce-scatter on this backend: build it from all-to-all
    got = torch.empty_like(buf)
    dist.all_to_all_single(got, buf.contiguous(), group=group)
    torch.sum(got.view(-1, out.numel()), dim=0, out=out)


def _parts(ranks: tuple[int, ...], nodes: tuple[int, ...]
           ) -> tuple[tuple[int, ...], tuple[int, ...], list[int]] | None:
    """(this rank's group inside its node, its group across nodes, block order) or None (flat).

    Torch orders a group's members by global rank, so the two-level reduce-scatter leaves the
    rank at position i of its node group and position j of its cross group with block
    i * m + j of the buffer (m nodes); ``order[i * m + j]`` is that rank's position in the
    sorted ``ranks``: the flat owner of the block it should end with.
    """
    parts = split(ranks, nodes)
    if parts is None:
        return None
    inside, across = parts
    m = len(inside)
    pos = {r: p for p, r in enumerate(sorted(ranks))}
    order = [0] * len(pos)
    for i, group in enumerate(across):
        for j, r in enumerate(group):
            order[i * m + j] = pos[r]
    me = dist.get_rank()
    mine = next(g for g in inside if me in g)
    return mine, across[mine.index(me)], order


def reduce_scatter_over(out: torch.Tensor, buf: torch.Tensor, ranks: tuple[int, ...],
                        nodes: tuple[int, ...] | None, groups: Any) -> None:
    """``out`` = this rank's block of ``buf`` (n blocks, n = len(ranks), flat layout) summed
    over ``ranks``: reduce-scatter inside the node, then across nodes, where the ranks sit
    k >= 2 per node on >= 2 nodes (``nodes`` given); one flat reduce-scatter otherwise."""
    parts = _parts(ranks, nodes) if nodes else None
    if parts is None:
        reduce_scatter(out, buf, groups.get(ranks))
        return
    inside, across, order = parts
    per = out.numel()
    assert buf.numel() == per * len(order), (buf.numel(), per, len(order))
    perm = buf.view(len(order), per)[order].reshape(-1)  # block i*m+j: its final owner's
    mid = buf.new_empty(per * len(across))
    reduce_scatter(mid, perm, groups.get(inside))  # (k-1)/k of the bytes inside the node
    reduce_scatter(out, mid, groups.get(across))  # (m-1)/m of 1/k of them across


def all_gather_over(out: torch.Tensor, mine: torch.Tensor, ranks: tuple[int, ...],
                    nodes: tuple[int, ...] | None, groups: Any) -> None:
    """``out`` = every rank's ``mine`` joined in sorted-rank order: all-gather across nodes
    (only this rank's block crosses), then inside the node; flat where ranks do not allow."""
    parts = _parts(ranks, nodes) if nodes else None
    if parts is None:
        dist.all_gather_single(out, mine.contiguous(), group=groups.get(ranks))
        return
    inside, across, order = parts
    per = mine.numel()
    mid = mine.new_empty(per * len(across))
    dist.all_gather_single(mid, mine.contiguous(), group=groups.get(across))
    full = mine.new_empty(per * len(order))
    dist.all_gather_single(full, mid, group=groups.get(inside))
    out.view(len(order), per)[order] = full.view(len(order), per)
