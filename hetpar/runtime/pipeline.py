"""Executes one rank's pipeline actions (F, B, W) from ``hetpar.schedules`` with gloo/NCCL p2p.

Sends are asynchronous and receives block, so any schedule whose actions respect the data
dependencies (every F after its predecessor chunk's F, every B after its successor's B)
runs without deadlock whatever the interleaving. With a split backward (zero-bubble, Qi et
al. 2023) B computes only the input gradient and keeps the graph; W then computes the weight
gradients from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hetpar.schedules import Action


def _tag(kind: int, chunk: int, mb: int) -> int:
    return (kind * 4096 + chunk) * 65536 + mb


class ChunkRunner:
    """What the executor needs from a worker: forward of one chunk and its parameters."""

    def forward(self, chunk: int, x: torch.Tensor | None, mb: int) -> torch.Tensor:
        raise NotImplementedError

    def chunk_params(self, chunk: int) -> list[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def peer(self, chunk: int) -> int | None:
        """Rank running ``chunk`` at this rank's TP index (None outside 0..chunks-1)."""
        raise NotImplementedError

    def act_shape(self) -> tuple[int, ...]:
        raise NotImplementedError


def run_actions(w: ChunkRunner, actions: Sequence[Action], num_chunks: int, split: bool,
                grads: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device) -> float:
    """Run ``actions`` for one iteration, adding weight gradients into ``grads``.

    Returns the sum of the loss values this rank computed (last chunk only).
    """
    me = dist.get_rank() if dist.is_initialized() else 0
    saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor, Any]] = {}
    mailbox: dict[int, torch.Tensor] = {}
    sends: list[Any] = []
    loss = 0.0

    def send(t: torch.Tensor, dst: int, tag: int) -> None:
        if dst == me:
            mailbox[tag] = t.detach().clone()
        else:
            sends.append(dist.isend(t.detach().contiguous(), dst, tag=tag))

    def recv(src: int, tag: int) -> torch.Tensor:
        if src == me:
            return mailbox.pop(tag)
        buf = torch.empty(w.act_shape(), dtype=dtype, device=device)
        dist.recv(buf, src, tag=tag)
        return buf

    for a in actions:
        c, mb = a.chunk, a.microbatch
        last = c == num_chunks - 1
        if a.kind == "F":
            inp = None
            if c > 0:
                inp = recv(_peer(w, c - 1), _tag(0, c, mb)).requires_grad_(True)
            out = w.forward(c, inp, mb)
            if last:
                loss += float(out.detach())
            else:
                send(out, _peer(w, c + 1), _tag(0, c + 1, mb))
            saved[(c, mb)] = (inp, out, None)
        elif a.kind == "B":
            inp, out, _ = saved[(c, mb)]
            gout = None if last else recv(_peer(w, c + 1), _tag(1, c, mb))
            if split:
                if inp is not None:
                    (gi,) = torch.autograd.grad(out, [inp], gout, retain_graph=True)
                    send(gi, _peer(w, c - 1), _tag(1, c - 1, mb))
                saved[(c, mb)] = (inp, out, gout)
            else:
                _backward(w, c, inp, out, gout, grads, send, mb)
                del saved[(c, mb)]
        else:
            _, out, gout = saved.pop((c, mb))
            _weight_grads(w, c, out, gout, grads)
    for s in sends:
        s.wait()
    assert not saved and not mailbox, "schedule left work undone"
    return loss


def _peer(w: ChunkRunner, chunk: int) -> int:
    p = w.peer(chunk)
    assert p is not None
    return p


def _backward(w: ChunkRunner, c: int, inp: torch.Tensor | None, out: torch.Tensor,
              gout: torch.Tensor | None, grads: dict[str, torch.Tensor], send: Any,
              mb: int) -> None:
    named = w.chunk_params(c)
    targets = [p for _, p in named] + ([inp] if inp is not None else [])
    res = torch.autograd.grad(out, targets, gout, allow_unused=True)
    _accumulate(named, res[: len(named)], grads)
    if inp is not None:
        gi = res[-1]
        assert gi is not None
        send(gi, _peer(w, c - 1), _tag(1, c - 1, mb))


def _weight_grads(w: ChunkRunner, c: int, out: torch.Tensor, gout: torch.Tensor | None,
                  grads: dict[str, torch.Tensor]) -> None:
    named = w.chunk_params(c)
    res = torch.autograd.grad(out, [p for _, p in named], gout, allow_unused=True)
    _accumulate(named, res, grads)


def _accumulate(named: list[tuple[str, torch.Tensor]], res: Sequence[torch.Tensor | None],
                grads: dict[str, torch.Tensor]) -> None:
    for (name, _), g in zip(named, res, strict=True):
        if g is not None:
            grads[name].add_(g)
