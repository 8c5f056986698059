"""Pipeline engine on ``torch.distributed.pipelining``, fed hetpar's own schedule action lists.

For replicas without TP (tp = 1) the plan's ``hetpar.schedules`` actions are handed to
PyTorch's ``_PipelineScheduleRuntime`` as its compute-only schedule IR (hetpar's chunk c runs
on pipeline rank c % pp, PyTorch's default "loop" stage placement), which lowers them to
sends and receives and runs them on ``PipelineStage``s wrapping the worker's chunks. Selected
with ``RunConfig(pp_engine="torch")``; the default engine is ``pipeline.run_actions``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetpar.errors import RuntimeGap
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.layout import Layout
from hetpar.schedules import Schedule


class _Chunk(nn.Module):
    """One model chunk of a worker as an ``nn.Module`` sharing the worker's tensors."""

    def __init__(self, w: Any, chunk: int) -> None:
        super().__init__()
        self.w, self.chunk = w, chunk
        self.names = w.chunk_names[chunk]
        for n in self.names:
            # A Parameter made from the worker's tensor shares its storage, so the worker's
            # in-place optimizer update is what the next forward sees.
            self.register_parameter(n.replace(".", "__"), nn.Parameter(w.params[n]))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n.replace(".", "__")) for n in self.names}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, p, m = self.w, self.tensors(), self.w.model
        if self.chunk == 0:
            x = M.embed(m, p, x, w.ctx)
        a, b = w.layout.stage_layers(w.role.replica, self.chunk)
        x = M.blocks(m, p, range(a, b), x, w.ctx, w.layout.plan.recompute, w.ep)
        if self.chunk == w.num_chunks - 1:
            x = F.linear(M._norm_fwd(m, p, "lnf", x), p["head"])  # logits; loss in loss_fn
        return x


def pp_groups(layout: Layout, timeout_s: float) -> dict[int, Any]:
    """One process group per replica's pipeline (every rank creates all, in order)."""
    out = {}
    for r, stages in enumerate(layout.stage_ranks):
        ranks = list(dict.fromkeys(s[0] for s in stages))
        if ranks != sorted(ranks):
            raise RuntimeGap("pp_engine 'torch' needs a replica's pipeline ranks in "
                             f"increasing order, got {ranks}")
        if len(ranks) > 1:
            g = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
            if dist.get_rank() in ranks:
                out[r] = g
    return out


class TorchPipeline:
    """Runs one replica's pipeline iterations through ``torch.distributed.pipelining``."""

    def __init__(self, w: Any, sched: Schedule, group: Any) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        if w.role.tp > 1 or w.model.tied_embeddings:
            raise RuntimeGap("pp_engine 'torch' needs tp = 1 and untied embeddings; "
                             "allowed otherwise: pp_engine 'hetpar'")
        self.w = w
        self.chunks = {c: _Chunk(w, c) for c in w.role.chunks}
        stages = [PipelineStage(self.chunks[c], c, w.num_chunks, w.device, group=group)
                  for c in w.role.chunks]
        self.runtime = _PipelineScheduleRuntime(
            stages, sched.num_microbatches, loss_fn=self._loss, scale_grads=False)
        self.runtime._prepare_schedule_with_comms(_actions(sched))

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               reduction="sum") / self.w.denom

    def step(self) -> float:
        """One iteration on ``w.tokens``; gradients land in ``w.grads``; returns local loss."""
        w = self.w
        assert w.tokens is not None
        for c in self.chunks.values():
            c.zero_grad(set_to_none=True)
        first, last = 0 in self.chunks, w.num_chunks - 1 in self.chunks
        losses: list[torch.Tensor] = []
        args = (w.tokens[:, :-1],) if first else ()
        self.runtime.step(*args, target=w.tokens[:, 1:] if last else None,
                          losses=losses if last else None, return_outputs=False)
        for c in self.chunks.values():
            for n, t in c.tensors().items():
                if t.grad is not None:
                    w.grads[n].add_(t.grad)
        return float(sum(float(x.detach()) for x in losses))


def _actions(sched: Schedule) -> dict[int, list[Any]]:
    """hetpar actions as PyTorch's schedule IR: F, B (full or input-only) and W."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    kind = {"F": _ComputationType.FORWARD, "W": _ComputationType.BACKWARD_WEIGHT,
            "B": (_ComputationType.BACKWARD_INPUT if sched.splits_backward
                  else _ComputationType.FULL_BACKWARD)}
    return {r: [_Action(a.chunk, kind[a.kind], a.microbatch) for a in acts]
            for r, acts in enumerate(sched.ranks)}
