"""Tensor- and sequence-parallel collectives as autograd functions (Megatron's f/g operators).

Shoeybi et al. 2019 (Megatron-LM, fig. 3) define ``f`` (identity forward, all-reduce
backward) before a column-parallel layer and ``g`` (all-reduce forward, identity backward)
after a row-parallel one. Korthikanti et al. 2022 (sequence parallelism, sec. 4.2.2) swap them
for all-gather / reduce-scatter along the sequence so norms and dropout run on 1/tp of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPContext:
    """A rank's tensor-parallel group; ``size == 1`` means no TP (and no collectives)."""

    group: Any = None
    size: int = 1
    rank: int = 0
    sp: bool = False


SINGLE = TPContext()


def _all_reduce(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=ctx.group)
    return x


def _all_gather_seq(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(ctx.size)]
    dist.all_gather(parts, x.contiguous(), group=ctx.group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_seq(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
    # all-reduce then keep the local slice: same sum as a reduce-scatter, works on gloo.
    return _all_reduce(x, ctx).chunk(ctx.size, dim=1)[ctx.rank].contiguous()


class _Enter(torch.autograd.Function):
    @staticmethod
    def forward(c: Any, x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
        c.tp = ctx
        return _all_gather_seq(x, ctx) if ctx.sp else x.view_as(x)

    @staticmethod
    def backward(c: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx = c.tp
        return (_reduce_scatter_seq(g, ctx) if ctx.sp else _all_reduce(g, ctx)), None


class _Exit(torch.autograd.Function):
    @staticmethod
    def forward(c: Any, x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
        c.tp = ctx
        return _reduce_scatter_seq(x, ctx) if ctx.sp else _all_reduce(x, ctx)

    @staticmethod
    def backward(c: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx = c.tp
        return (_all_gather_seq(g, ctx) if ctx.sp else g), None


def enter(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
    """Into a TP region (before column-parallel weights): Megatron's ``f`` or SP all-gather."""
    if ctx.size == 1:
        return x
    out: torch.Tensor = _Enter.apply(x, ctx)
    return out


def exit(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:  # noqa: A001
    """Out of a TP region (after row-parallel weights): Megatron's ``g`` or SP reduce-scatter."""
    if ctx.size == 1:
        return x
    out: torch.Tensor = _Exit.apply(x, ctx)
    return out


def seq_shard(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
    """The local sequence slice under SP (plain slicing: its gradient is zero elsewhere)."""
    if ctx.size == 1 or not ctx.sp:
        return x
    return x.chunk(ctx.size, dim=1)[ctx.rank]


def reduce_sum(x: torch.Tensor, ctx: TPContext) -> torch.Tensor:
    """Sum over the TP group; backward identity (the consumer is replicated on every rank)."""
    if ctx.size == 1:
        return x
    out: torch.Tensor = _Exit.apply(x, TPContext(ctx.group, ctx.size, ctx.rank, False))
    return out


def all_reduce_max(x: torch.Tensor, ctx: TPContext) -> None:
    """In-place maximum over the TP group (no gradient)."""
    if ctx.size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=ctx.group)
