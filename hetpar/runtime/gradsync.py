"""Data-parallel gradient sync in buckets, ZeRO-1 sharded updates, and NTP gradient resharding.

Every parameter is reduced over the ranks that hold it in any replica. When all holders use
the same TP degree each TP shard is reduced over its own DP group (shard-sized buckets, the
usual DDP all-reduce, Li et al. 2020). When replicas differ in TP degree (nonuniform TP) the
sharded dimension is cut into L = lcm(degrees) pieces; piece j lives on exactly one rank of
each replica, so it is reduced over those ranks only and every rank moves just its own shard
(gradient resharding). L divides the dimension because every degree does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist

from hetpar.runtime.layout import Layout
from hetpar.runtime.model import ParamInfo, param_infos

Mode = Literal["shard", "piece"]


@dataclass(frozen=True)
class Holding:
    """One rank's piece of a parameter."""

    rank: int
    tp_rank: int
    tp: int


def holdings(layout: Layout) -> dict[str, set[Holding]]:
    """For every parameter name, which ranks hold which TP shard of it. An expert is held by
    the ranks of one ``ep`` coordinate (``Layout.experts_of``): its gradient is reduced over
    them, the expert-data-parallel group (the mesh's ``edp``), the dense ones over DP."""
    out: dict[str, set[Holding]] = {}
    for r, stages in enumerate(layout.stage_ranks):
        last = len(stages) - 1
        for j, ranks in enumerate(stages):
            a, b = layout.stage_layers(r, j)
            for k, rank in enumerate(ranks):
                names = param_infos(layout.model, range(a, b), j == 0, j == last,
                                    layout.experts_of(rank))
                for name in names:
                    out.setdefault(name, set()).add(Holding(rank, k, len(ranks)))
    return out


@dataclass
class Entry:
    """A parameter inside a bucket: its offset and size in the bucket's flat buffer."""

    name: str
    mode: Mode
    offset: int
    numel: int
    contributes: bool
    piece: tuple[int, int] = (0, 1)
    """For "piece" entries: (index inside this rank's shard, pieces per shard)."""


@dataclass
class Bucket:
    """Parameters reduced together over one group of ranks."""

    ranks: tuple[int, ...]
    entries: list[Entry] = field(default_factory=list)
    numel: int = 0


def plan_buckets(layout: Layout, rank: int, bucket_numel: int,
                 held: dict[str, set[Holding]] | None = None) -> list[Bucket]:
    """This rank's buckets, in a deterministic order shared by the other members.

    ``held`` is ``holdings(layout)``, passed in when planning for many ranks.
    """
    sp = layout.plan.sequence_parallel
    infos = all_infos(layout)
    items: list[tuple[tuple[int, ...], str, int, Mode, int, bool, tuple[int, int]]] = []
    for name, hs in sorted((held or holdings(layout)).items()):
        mine = [h for h in hs if h.rank == rank]
        if not mine:
            continue
        me, info = mine[0], infos[name]
        tps = {h.tp for h in hs}
        size = _numel(info.shape)
        if info.shard_dim is not None and len(tps) == 1:
            ranks = tuple(sorted(h.rank for h in hs if h.tp_rank == me.tp_rank))
            items.append((ranks, name, 0, "shard", size // me.tp, True, (0, 1)))
        elif info.shard_dim is not None:
            lcm = math.lcm(*tps)
            assert info.shape[info.shard_dim] % lcm == 0, (name, tps)
            per = lcm // me.tp
            for i in range(per):
                j = me.tp_rank * per + i
                ranks = tuple(sorted(h.rank for h in hs if h.tp_rank == j * h.tp // lcm))
                items.append((ranks, name, j, "piece", size // lcm, True, (i, per)))
        else:
            # A replicated weight: under SP each TP rank holds a partial gradient (its
            # sequence slice) and all contribute; otherwise TP ranks hold equal copies.
            items.append((_all_ranks(hs), name, 0, "shard", size, sp or me.tp_rank == 0,
                          (0, 1)))
    buckets: list[Bucket] = []
    for ranks, name, _, mode, numel, contributes, piece in sorted(items, key=lambda x: x[:3]):
        if len(ranks) < 2:
            continue
        if not buckets or buckets[-1].ranks != ranks or buckets[-1].numel >= bucket_numel:
            buckets.append(Bucket(ranks))
        b = buckets[-1]
        b.entries.append(Entry(name, mode, b.numel, numel, contributes, piece))
        b.numel += numel
    return buckets


def sync_groups(layout: Layout) -> set[tuple[int, ...]]:
    """Rank tuples of every gradient-sync group of the run (the same on every rank)."""
    held = holdings(layout)
    return {b.ranks for r in range(layout.world_size)
            for b in plan_buckets(layout, r, 1 << 62, held)}


def _piece(t: torch.Tensor, info: ParamInfo, piece: tuple[int, int]) -> torch.Tensor:
    """View of piece ``piece[0]`` of ``piece[1]`` of a local shard along its shard dim."""
    assert info.shard_dim is not None
    return t.chunk(piece[1], dim=info.shard_dim)[piece[0]]


def _all_ranks(hs: set[Holding]) -> tuple[int, ...]:
    return tuple(sorted({h.rank for h in hs}))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def all_infos(layout: Layout) -> dict[str, ParamInfo]:
    """ParamInfo of every parameter of the model."""
    m = layout.model
    return param_infos(m, range(m.n_layers), True, True)


def pack(b: Bucket, tensors: dict[str, torch.Tensor], infos: dict[str, ParamInfo],
         force: bool = False) -> torch.Tensor:
    """Flatten this rank's contribution to bucket ``b`` (zeros where it does not contribute).

    ``force`` packs every entry (used for parameters, which all holders have equal copies of).
    """
    any_t = next(iter(tensors.values()))
    flat = torch.zeros(b.numel, dtype=any_t.dtype, device=any_t.device)
    for e in b.entries:
        if not (e.contributes or force):
            continue
        t = tensors[e.name]
        if e.mode == "piece":
            t = _piece(t, infos[e.name], e.piece)
        flat[e.offset: e.offset + e.numel].copy_(t.reshape(-1))
    return flat


def unpack(b: Bucket, flat: torch.Tensor, out: dict[str, torch.Tensor],
           infos: dict[str, ParamInfo]) -> None:
    """Copy the reduced bucket back into ``out`` (pieces into their slice of the shard)."""
    for e in b.entries:
        piece = flat[e.offset: e.offset + e.numel]
        info = infos[e.name]
        if e.mode == "piece":
            dst = _piece(out[e.name], info, e.piece)
            dst.copy_(piece.view(dst.shape))
            continue
        out[e.name].copy_(piece.reshape(out[e.name].shape))


def all_reduce_buckets(buckets: list[Bucket], grads: dict[str, torch.Tensor],
                       infos: dict[str, ParamInfo], groups: object,
                       nodes: tuple[int, ...] | None = None) -> list[torch.Tensor]:
    """Sum gradients over each bucket's ranks (async, one call per bucket); returns the flats.

    With ``nodes`` (node of every rank) each bucket is reduced hierarchically instead
    (``hiersync``: inside nodes, shards across, gather inside).
    """
    if nodes:
        from hetpar.runtime import hiersync

        out = []
        for b in buckets:
            flat = pack(b, grads, infos)
            hiersync.all_reduce(flat, b.ranks, nodes, groups)
            unpack(b, flat, grads, infos)
            out.append(flat)
        return out
    flats, works = [], []
    for b in buckets:
        flat = pack(b, grads, infos)
        works.append(dist.all_reduce(flat, group=groups.get(b.ranks), async_op=True))  # type: ignore[attr-defined]
        flats.append(flat)
    for b, w, flat in zip(buckets, works, flats, strict=True):
        w.wait()
        unpack(b, flat, grads, infos)
    return flats
