"""The degraded plan after rank failures: shrink a replica's TP (NTP) or drop it, per the plan.

Pure Python (no torch): the recovery and its reference run both derive the same new plan from
the old layout and the set of dead ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetpar.errors import Infeasible
from hetpar.runtime.layout import Layout, check_tp
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage


@dataclass(frozen=True, kw_only=True)
class Degraded:
    """The new plan (devices = new ranks), the old->new rank map and the healthy donors."""

    plan: Plan
    new_rank: dict[int, int]
    """Surviving old rank -> rank in the new world (ranks the new plan leaves idle are absent)."""
    donor_replica: int
    """Index (in the old plan) of a replica that lost nothing: the source of the state."""
    replica_map: dict[int, int]
    """Old replica index -> new replica index, for the replicas that remain."""


def _max_tp(layout: Layout, survivors: int) -> int:
    for t in range(survivors, 0, -1):
        try:
            check_tp(layout.model, t)
        except Infeasible:
            continue
        if layout.plan.sequence_parallel and layout.model.seq_len % t:
            continue
        return t
    return 1


def degrade(layout: Layout, dead: set[int], need_donor: bool = True) -> Degraded:
    """The plan the survivors run after ``dead`` ranks are lost (``plan.on_failure`` policy).

    NTP (Narayanan-style nonuniform tensor parallelism): a replica that lost ranks keeps its
    batch share and continues at the largest TP degree its surviving ranks support. Drop: the
    replica leaves and its batch is handed to the others in micro-batch units, so the global
    batch (and thus the training arithmetic) is unchanged either way. A replica with a stage
    left without any rank (tp = 1) is dropped under either policy. ``need_donor``: the state
    comes from a replica that lost nothing (in-memory recovery) rather than from disk.
    """
    plan = layout.plan
    hit = {r for r, stages in enumerate(layout.stage_ranks)
           if any(k in dead for s in stages for k in s)}
    gone = {r for r in hit if plan.on_failure == "drop" or any(
        all(k in dead for k in s) for s in layout.stage_ranks[r])}
    healthy = [r for r in range(layout.replicas) if r not in hit]
    if not healthy and need_donor:
        raise Infeasible("recovery", "every replica lost a rank: no healthy copy of the state")
    if len(gone) == layout.replicas:
        raise Infeasible("recovery", f"ranks {sorted(dead)} leave no replica able to continue")
    kept: list[tuple[int, list[tuple[Stage, tuple[int, ...]]], int]] = []
    for r, rep in enumerate(plan.replicas):
        stages = list(zip(rep.stages, layout.stage_ranks[r], strict=True))
        if r in gone:
            continue
        if r in hit:
            alive = [[k for k in ranks if k not in dead] for _, ranks in stages]
            t = _max_tp(layout, min(len(a) for a in alive))
            stages = [(replace(s, tp=t, devices=None), tuple(a[:t]))
                      for (s, _), a in zip(stages, alive, strict=True)]
        kept.append((r, stages, rep.batch))
    batches = _redistribute(plan, kept, gone)
    used = sorted(k for _, stages, _ in kept for _, ranks in stages for k in ranks)
    new_rank = {old: i for i, old in enumerate(used)}
    reps = []
    for (r, stages, _), batch in zip(kept, batches, strict=True):
        new_stages = tuple(replace(s, group="local", devices=tuple(new_rank[k] for k in ranks))
                           for s, ranks in stages)
        reps.append(Replica(stages=new_stages, batch=batch,
                            micro_batch=plan.replicas[r].micro_batch))
    new_plan = replace(plan, replicas=tuple(reps), global_batch=sum(batches))
    new_axes = _expert_axes(new_plan, layout.model.n_experts)
    new_plan = replace(new_plan, axes=new_axes,
                       experts_per_rank=new_plan.split_at(dict(new_axes).get("ep", 1)))
    return Degraded(plan=new_plan, new_rank=new_rank, donor_replica=healthy[0] if healthy else -1,
                    replica_map={r: i for i, (r, _, _) in enumerate(kept)})


def _redistribute(plan: Plan, kept: list[tuple[int, list[tuple[Stage, tuple[int, ...]]], int]],
                  gone: set[int]) -> list[int]:
    batches = [b for _, _, b in kept]
    lost = sum(plan.replicas[r].batch for r in gone)
    mbs = [plan.replicas[r].micro_batch for r, _, _ in kept]
    i = 0
    while lost > 0:
        if all(m > lost for m in mbs):
            raise Infeasible("recovery", f"cannot hand {lost} sequences to the remaining "
                             f"replicas in micro-batches of {sorted(set(mbs))}")
        if mbs[i] <= lost:
            batches[i] += mbs[i]
            lost -= mbs[i]
        i = (i + 1) % len(kept)
    return batches


def _expert_axes(plan: Plan, n_experts: int) -> tuple[tuple[str, int], ...]:
    """``plan.axes`` with ep lowered to the largest degree the remaining replicas carry: it
    divides the experts and the replicas (the runtime runs EP at tp = 1, carved from dp), and
    above 1 needs replicas of one shape (runtime/layout.py). The experts the lost ranks held
    come back from the checkpoint, which holds every expert once."""
    ep = plan.degree("ep")
    reps = plan.replicas
    same = len({(tuple(s.layers for s in r.stages), r.num_microbatches) for r in reps}) == 1
    fits = [d for d in range(ep, 0, -1)
            if n_experts % d == 0 and len(reps) % d == 0 and (d == 1 or same)]
    return tuple((a, fits[0] if a == "ep" else d) for a, d in plan.axes)
