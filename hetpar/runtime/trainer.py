"""The training loop of one rank, and the single-process reference trainer it must match."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hetpar.errors import ConfigError, Infeasible, RuntimeGap
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.data import global_batch, replica_rows
from hetpar.runtime.gradsync import sync_groups
from hetpar.runtime.groups import Groups
from hetpar.runtime.layout import Layout
from hetpar.runtime.optim import AdamState, adam_update
from hetpar.runtime.pipeline import run_actions
from hetpar.runtime.tp import SINGLE
from hetpar.runtime.worker import RunConfig, Worker
from hetpar.schedules import DEFAULT, Schedule, build
from hetpar.specs.model import ModelSpec


class NonFiniteLoss(ConfigError):
    """The global loss of a step is NaN or infinite (``on_nan = "stop"``)."""


def check_loss(loss: float, step: int, cfg: RunConfig) -> bool:
    """True if the step's update may be applied; raises NonFiniteLoss under ``stop``.

    Every rank sees the same world-reduced loss, so all take the same branch.
    """
    if math.isfinite(loss):
        return True
    if cfg.on_nan == "stop":
        raise NonFiniteLoss(f"training: loss is {loss} at step {step} (lr {cfg.adam.lr:g}); "
                            "stopped before the update (lower --lr, or --on-nan skip)")
    return False


@dataclass
class RankResult:
    """What one rank returns: global losses per step, its local parameters, step times."""

    rank: int
    losses: list[float] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


def schedule_for(layout: Layout, replica: int) -> Schedule:
    """The plan's pipeline schedule for ``replica`` (its own microbatch count)."""
    rep = layout.plan.replicas[replica]
    pp = layout.plan.pp_of(rep)
    try:
        return build(layout.plan.schedule, pp, rep.num_microbatches, layout.plan.vpp)
    except Infeasible:
        if pp * layout.plan.vpp > 1:
            raise
        # One stage: every schedule degenerates to F then B per microbatch (the default's
        # order; gradients accumulate in the same microbatch order whatever the schedule).
        return build(DEFAULT, 1, rep.num_microbatches, 1)


def train_step(w: Worker, step: int, sched: Schedule, engine: Any = None) -> float:
    """Run one iteration on this rank; returns the global mean loss (a world all-reduce)."""
    m, plan = w.model, w.layout.plan
    seq = m.seq_len
    tokens = global_batch(m, step, plan.batch, seq, w.cfg.seed, w.device)
    a, b = replica_rows([r.batch for r in plan.replicas], w.role.replica)
    w.tokens, w.denom = tokens[a:b], plan.batch * seq
    w.zero_grads()
    if engine is not None:
        local = engine.step()
    else:
        local = run_actions(w, sched.ranks[w.role.pp_rank], w.num_chunks,
                            sched.splits_backward, w.grads, w.cfg.dtype, w.device)
    flats = w.reduce_grads()
    # With a vocab-parallel head (or without SP) TP ranks hold copies of the loss; with a
    # replicated head under SP each covers its sequence slice.
    partial = w.ctx.sp and not M.vocab_parallel(m, w.ctx)
    mine = local if (partial or w.role.tp_rank == 0) else 0.0
    t = torch.tensor([mine], dtype=torch.float64, device=w.device)
    # World-wide all-reduce before any update: a rank lost during the step fails it here,
    # so no rank has applied the step's update (the recovery relies on this).
    dist.all_reduce(t)
    loss = float(t.item())
    if check_loss(loss, step, w.cfg):
        w.update(flats)
    return loss


def train_rank(layout: Layout, cfg: RunConfig, steps: int, *, checkpoint: str | None = None,
               every: int = 0, progress: bool = False, resume: int | None = None,
               failed_at: float | None = None) -> RankResult:
    """Train this (initialised) rank of ``layout`` up to iteration ``steps``.

    With ``checkpoint``, resume from step ``resume`` saved there (None: the verified latest)
    and save every ``every`` iterations (and at the end), keeping ``cfg.keep`` steps.
    ``failed_at`` (wall time a failure was detected) makes rank 0 report the recovery time.
    """
    if checkpoint:  # DCP pulls in DTensor and sympy (~1 s a process): only runs that save
        from hetpar.runtime import checkpoint as ck

        if resume is None:
            resume = ck.latest_step(checkpoint)
    if layout.plan.zero == 3:
        from hetpar.runtime.fsdp import train_fsdp

        return train_fsdp(layout, cfg, steps, checkpoint, every, resume or 0, progress,
                          failed_at)
    w = make_worker(layout, cfg)
    start = 0
    if checkpoint and resume:
        ck.load(w, checkpoint, resume)
        start = resume
    res = RankResult(w.role.rank)
    sched = schedule_for(layout, w.role.replica)
    engine = _torch_engine(w, sched) if cfg.pp_engine == "torch" else None
    if engine is None and layout.plan.vpp > 1 and dist.get_backend() == "nccl":
        # NCCL ignores p2p tags: two chunks' messages between the same pair of ranks could
        # be matched in the wrong order, so interleaved schedules need PyTorch's engine.
        raise RuntimeGap("plan: vpp > 1 on NCCL needs pp_engine 'torch' (--pp-engine torch)")
    for step in range(start, steps):
        t0 = time.perf_counter()
        res.losses.append(train_step(w, step, sched, engine))
        res.step_times.append(time.perf_counter() - t0)
        if w.role.rank == 0:
            report_step(step, res, progress, failed_at if step == start else None)
        if checkpoint and ((every and (step + 1) % every == 0) or step + 1 == steps):
            ck.save(w, checkpoint, step + 1, cfg.keep)
    res.params = {n: p.detach().clone() for n, p in w.params.items()}
    return res


def report_step(step: int, res: RankResult, progress: bool, failed_at: float | None) -> None:
    """Rank 0's progress line for ``step`` (and, after a restart, the recovery time)."""
    loss = res.losses[-1]
    if progress:
        skipped = "" if math.isfinite(loss) else "  update skipped (--on-nan skip)"
        print(f"step {step}: loss {loss:.6f} ({res.step_times[-1]:.3f} s){skipped}",
              file=sys.stderr, flush=True)
    if failed_at is not None:
        dt = time.time() - failed_at
        res.events.append(f"recovered {dt:.2f} s")
        if progress:
            print(f"hetpar run: recovered: step {step} done {dt:.1f} s after the failure was "
                  "detected", file=sys.stderr, flush=True)


def _torch_engine(w: Worker, sched: Schedule) -> Any:
    """A torch.distributed.pipelining engine for this rank's replica (None without PP)."""
    from hetpar.runtime.pp_torch import TorchPipeline, pp_groups

    groups = pp_groups(w.layout, w.cfg.timeout_s)
    group = groups.get(w.role.replica)
    return TorchPipeline(w, sched, group) if group is not None else None


def make_worker(layout: Layout, cfg: RunConfig) -> Worker:
    """Process groups and this rank's worker (collective: every rank must call it)."""
    dp = sync_groups(layout)
    needed = set(dp)
    if layout.plan.zero in (1, 2) and layout.plan.zero_scope == "group":
        from hetpar.runtime.hybrid import needed_groups as hybrid_groups

        needed |= hybrid_groups(layout, dp)
    if layout.hierarchical:  # every sync group's two levels (ZeRO groups, cross-group too)
        from hetpar.runtime.hiersync import needed_groups

        needed |= needed_groups(needed, layout.nodes)
    needed |= {layout.ep_ranks(r) for r in range(layout.world_size)}  # dispatch, combine
    groups = Groups(layout, needed, cfg.timeout_s, cfg.device)
    return Worker(layout, layout.roles[dist.get_rank()], groups, cfg)


def reference(model: ModelSpec, batch: int, steps: int, cfg: RunConfig,
              start: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process training on the same global batches: the parity reference."""
    infos = M.param_infos(model, range(model.n_layers), True, True)
    params = {n: M.init_param(n, i, cfg.seed, cfg.dtype, cfg.device).requires_grad_(True)
              for n, i in infos.items()}
    state = {n: AdamState(p) for n, p in params.items()}
    seq, losses = model.seq_len, []
    for step in range(start, start + steps):
        tokens = global_batch(model, step, batch, seq, cfg.seed, cfg.device)
        x = M.embed(model, params, tokens[:, :-1], SINGLE)
        x = M.blocks(model, params, range(model.n_layers), x, SINGLE)
        loss = M.head_loss(model, params, x, tokens[:, 1:], SINGLE, batch * seq)
        grads = torch.autograd.grad(loss, list(params.values()))
        for (n, p), g in zip(params.items(), grads, strict=True):
            adam_update(p.data, g, state[n], step - start + 1, cfg.adam)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach() for n, p in params.items()}


def gather_full(layout: Layout, results: list[RankResult], replica: int) -> dict[str, torch.Tensor]:
    """Reassemble full parameters of ``replica`` from its ranks' TP shards (and the experts
    its ranks do not hold from the other ranks of their EP groups)."""
    infos = M.param_infos(layout.model, range(layout.model.n_layers), True, True)
    out: dict[str, torch.Tensor] = {}
    for stage in layout.stage_ranks[replica]:
        for name in {n for k in stage for g in layout.ep_ranks(k) for n in results[g].params}:
            d = infos[name].shard_dim
            parts = [results[_holder(layout, results, r, name)].params[name] for r in stage]
            out[name] = parts[0] if d is None else torch.cat(parts, dim=d)
    return out


def _holder(layout: Layout, results: list[RankResult], rank: int, name: str) -> int:
    """``rank``, or the rank of its EP group that holds parameter ``name`` (an expert)."""
    return next(g for g in (rank, *layout.ep_ranks(rank)) if name in results[g].params)
