"""ZeRO-1/2 shards of a gradient bucket, and hybrid sharding (``zero_scope = "group"``).

Under ``zero_scope = "all"`` a bucket's n ranks each own a contiguous 1/n of its flat buffer
(ZeRO-1, Rajbhandari et al. 2020 Sec. 5.1). Under ``"group"`` the ZeRO group is the bucket's
ranks on this rank's node group (``Layout.zero_peers``), which each hold a full copy; the
gradient is reduce-scattered inside every node group and each shard is then all-reduced with
the ranks of the other node groups holding the same elements (PyTorch FSDP ``HYBRID_SHARD``:
reduce-scatter over the shard group, all-reduce over the replicate group; the simulator costs
the same two steps, ``sim/structure.py`` ``_cross_sync``). Node groups may hold different numbers
of replicas: the buffer is padded to a multiple of L = lcm of their ZeRO group sizes and cut
into L pieces; piece j belongs to one rank of each node group, and the pieces a rank shares
with the same ranks are all-reduced in one call (with equal sizes: one call per rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetpar.runtime import hiersync
from hetpar.runtime.gradsync import Bucket
from hetpar.runtime.layout import Layout


@dataclass(frozen=True, kw_only=True)
class Shard:
    """One rank's ZeRO shard of one bucket."""

    ranks: tuple[int, ...]
    """The ZeRO group (sorted): the bucket's ranks, or those on this rank's node group."""
    index: int
    """This rank's position in ``ranks``: it owns elements [index * per, (index + 1) * per)."""
    padded: int
    """Flat length, zero-padded so every node group's ZeRO group size divides it."""
    cross: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    """Hybrid sharding: (start, end) inside this rank's shard and the ranks (one per node
    group, sorted) that all-reduce those elements; empty under ``zero_scope = "all"``."""

    @property
    def per(self) -> int:
        return self.padded // len(self.ranks)

    @property
    def hybrid(self) -> bool:
        """True when the bucket's gradient is reduced in the two hybrid steps."""
        return bool(self.cross)

    def slice(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of ``flat`` (zero-padded to ``padded``)."""
        if flat.numel() < self.padded:
            flat = torch.cat([flat, flat.new_zeros(self.padded - flat.numel())])
        return flat[self.index * self.per: (self.index + 1) * self.per]


def shard_of(layout: Layout, b: Bucket, rank: int) -> Shard:
    """``rank``'s shard of bucket ``b`` under the plan's ``zero_scope``."""
    own = layout.zero_peers(b.ranks, rank)
    groups = _zero_groups(layout, b.ranks)
    if len(groups) == 1:
        n = len(own)
        return Shard(ranks=own, index=own.index(rank), padded=-(-b.numel // n) * n)
    lcm = math.lcm(*(len(g) for g in groups))
    padded = -(-b.numel // lcm) * lcm
    piece, n, i = padded // lcm, len(own), own.index(rank)
    runs: list[tuple[int, int, tuple[int, ...]]] = []
    for j in range(i * lcm // n, (i + 1) * lcm // n):
        peers = _holders(groups, j, lcm)
        a = j * piece - i * (padded // n)
        if runs and runs[-1][2] == peers:
            runs[-1] = (runs[-1][0], a + piece, peers)
        else:
            runs.append((a, a + piece, peers))
    return Shard(ranks=own, index=i, padded=padded, cross=tuple(runs))


def _zero_groups(layout: Layout, ranks: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The ZeRO groups DP group ``ranks`` splits into (one per node group, cluster order)."""
    return list(dict.fromkeys(layout.zero_peers(ranks, r) for r in sorted(ranks)))


def _holders(groups: list[tuple[int, ...]], j: int, lcm: int) -> tuple[int, ...]:
    """The rank of every ZeRO group that owns piece ``j`` of ``lcm`` (sorted)."""
    return tuple(sorted(g[j * len(g) // lcm] for g in groups))


def needed_groups(layout: Layout, dp_groups: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
    """Rank tuples of the ZeRO groups and cross-group all-reduces of ``dp_groups`` (the
    gradient-sync groups, ``gradsync.sync_groups``); independent of the bucket size."""
    out: set[tuple[int, ...]] = set()
    for ranks in dp_groups:
        groups = _zero_groups(layout, ranks)
        out.update(groups)
        if len(groups) > 1:
            lcm = math.lcm(*(len(g) for g in groups))
            out.update(_holders(groups, j, lcm) for j in range(lcm))
    return {g for g in out if len(g) > 1}


def reduce(sh: Shard, flat: torch.Tensor, groups: Any,
           nodes: tuple[int, ...] | None = None) -> torch.Tensor:
    """This rank's shard of ``flat`` summed over the bucket's ranks: a reduce-scatter over
    the ZeRO group and, under hybrid sharding, the all-reduce of its pieces across node
    groups. With ``nodes`` (``dp_sync = "hierarchical"``) each is split in two levels where
    its ranks span nodes (``hiersync``), moving the bytes the simulator prices."""
    full = torch.cat([flat, flat.new_zeros(sh.padded - flat.numel())])
    if len(sh.ranks) > 1:
        buf = torch.empty(sh.per, dtype=flat.dtype, device=flat.device)
        hiersync.reduce_scatter_over(buf, full, sh.ranks, nodes, groups)
    else:
        buf = full
    for a, b, peers in sh.cross:
        part = buf[a:b].clone()
        if nodes:
            hiersync.all_reduce(part, peers, nodes, groups)
        else:
            dist.all_reduce(part, group=groups.get(peers))
        buf[a:b].copy_(part)
    return buf


def gather(sh: Shard, mine: torch.Tensor, groups: Any,
           nodes: tuple[int, ...] | None = None) -> torch.Tensor:
    """All shards of the ZeRO group joined (length ``padded``): one all-gather inside it,
    in two levels with ``nodes`` where the group spans nodes."""
    if len(sh.ranks) == 1:
        return mine
    out = mine.new_empty(sh.padded)
    hiersync.all_gather_over(out, mine, sh.ranks, nodes, groups)
    return out
