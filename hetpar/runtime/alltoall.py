"""All-to-all with uneven splits as an autograd function: expert parallelism's dispatch and
combine (its backward is the same exchange with the splits swapped)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def exchange(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """Rows ``x`` cut into ``send[i]`` rows for the i-th rank of ``group``; returns the rows
    every rank sent here, ``recv[i]`` from the i-th, in group order.

    gloo executes uneven splits itself: torch's ProcessGroupGloo::alltoall_base runs
    gloo::alltoallv (torch 2.13: verified on two ranks with splits 1/3 and 2/2, the parity
    tests run it), so no exchange has to be built from all-gathers or send/receive pairs.
    """
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """``exchange`` forward; the gradient of what was received goes back to its sender."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int],
                group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def counts(mine: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    """Each rank's ``mine`` (``size`` equal parts, part i meant for rank i) exchanged: returns
    the parts the ranks sent here, in group order (no gradient: split sizes)."""
    out = torch.empty_like(mine)
    dist.all_to_all_single(out, mine.contiguous(), group=group)
    return out.view(size, -1)
