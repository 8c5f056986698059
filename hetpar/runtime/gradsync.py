"""Data-parallel gradient sync in buckets, ZeRO-1 sharded updates, and NTP gradient resharding.

Every parameter is reduced over the ranks that hold it in any replica. When all holders use
the same TP degree each TP shard is reduced over its own DP group (shard-sized buckets, the
usual DDP all-reduce, Li et al. 2020). When replicas differ in TP degree (nonuniform TP) each
rank scatters its shard into a zero tensor of the full shape and the full tensor is reduced
over all holders: every replica covers the full tensor exactly once, so the sum is the global
gradient, from which each rank takes its own shard back (gradient resharding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist

from hetpar.runtime.layout import Layout
from hetpar.runtime.model import ParamInfo, param_infos

Mode = Literal["shard", "full"]


@dataclass(frozen=True)
class Holding:
    """One rank's piece of a parameter."""

    rank: int
    tp_rank: int
    tp: int


def holdings(layout: Layout) -> dict[str, set[Holding]]:
    """For every parameter name, which ranks hold which TP shard of it."""
    out: dict[str, set[Holding]] = {}
    for r, stages in enumerate(layout.stage_ranks):
        last = len(stages) - 1
        for j, ranks in enumerate(stages):
            a, b = layout.stage_layers(r, j)
            for name in param_infos(layout.model, range(a, b), j == 0, j == last):
                for k, rank in enumerate(ranks):
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
    items: list[tuple[tuple[int, ...], str, Mode, int, bool]] = []
    for name, hs in sorted((held or holdings(layout)).items()):
        mine = [h for h in hs if h.rank == rank]
        if not mine:
            continue
        me, info = mine[0], infos[name]
        tps = {h.tp for h in hs}
        if info.shard_dim is not None and len(tps) == 1:
            ranks = tuple(sorted(h.rank for h in hs if h.tp_rank == me.tp_rank))
            mode: Mode = "shard"
            numel = _numel(info.shape) // me.tp
            contributes = True
        elif info.shard_dim is not None:
            ranks, mode, numel, contributes = _all_ranks(hs), "full", _numel(info.shape), True
        else:
            # A replicated weight: under SP each TP rank holds a partial gradient (its
            # sequence slice) and all contribute; otherwise TP ranks hold equal copies.
            ranks, mode, numel = _all_ranks(hs), "shard", _numel(info.shape)
            contributes = sp or me.tp_rank == 0
        if len(ranks) > 1:
            items.append((ranks, name, mode, numel, contributes))
    buckets: list[Bucket] = []
    for ranks, name, mode, numel, contributes in sorted(items, key=lambda x: (x[0], x[1])):
        if not buckets or buckets[-1].ranks != ranks or buckets[-1].numel >= bucket_numel:
            buckets.append(Bucket(ranks))
        b = buckets[-1]
        b.entries.append(Entry(name, mode, b.numel, numel, contributes))
        b.numel += numel
    return buckets


def sync_groups(layout: Layout) -> set[tuple[int, ...]]:
    """Rank tuples of every gradient-sync group of the run (the same on every rank)."""
    held = holdings(layout)
    return {b.ranks for r in range(layout.world_size)
            for b in plan_buckets(layout, r, 1 << 62, held)}


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
         tp_rank: int, tp: int, force: bool = False) -> torch.Tensor:
    """Flatten this rank's contribution to bucket ``b`` (zeros where it does not contribute).

    ``force`` packs every entry (used for parameters, which all holders have equal copies of).
    """
    any_t = next(iter(tensors.values()))
    flat = torch.zeros(b.numel, dtype=any_t.dtype, device=any_t.device)
    for e in b.entries:
        if not (e.contributes or force):
            continue
        t = tensors[e.name]
        if e.mode == "full":
            full = torch.zeros(infos[e.name].shape, dtype=t.dtype, device=t.device)
            d = infos[e.name].shard_dim
            assert d is not None
            full.chunk(tp, dim=d)[tp_rank].copy_(t)
            t = full
        flat[e.offset: e.offset + e.numel].copy_(t.reshape(-1))
    return flat


def unpack(b: Bucket, flat: torch.Tensor, out: dict[str, torch.Tensor],
           infos: dict[str, ParamInfo], tp_rank: int, tp: int) -> None:
    """Copy the reduced bucket back into ``out`` (taking this rank's shard of full entries)."""
    for e in b.entries:
        piece = flat[e.offset: e.offset + e.numel]
        info = infos[e.name]
        if e.mode == "full":
            assert info.shard_dim is not None
            piece = piece.view(info.shape).chunk(tp, dim=info.shard_dim)[tp_rank]
        out[e.name].copy_(piece.reshape(out[e.name].shape))


def all_reduce_buckets(buckets: list[Bucket], grads: dict[str, torch.Tensor],
                       infos: dict[str, ParamInfo], groups: object, tp_rank: int,
                       tp: int) -> list[torch.Tensor]:
    """Sum gradients over each bucket's ranks (async, one call per bucket); returns the flats."""
    flats, works = [], []
    for b in buckets:
        flat = pack(b, grads, infos, tp_rank, tp)
        works.append(dist.all_reduce(flat, group=groups.get(b.ranks), async_op=True))  # type: ignore[attr-defined]
        flats.append(flat)
    for b, w, flat in zip(buckets, works, flats, strict=True):
        w.wait()
        unpack(b, flat, grads, infos, tp_rank, tp)
    return flats
