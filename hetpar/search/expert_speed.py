"""More experts on faster GPUs as a searched option: the top EP plans with ``by_speed``.

On a cluster of one GPU type every EP rank is as fast as the next and the even split is the
best (``tests/test_sim_expert_split.py``), so nothing is tried there. Elsewhere each of the
top plans with ep > 1 is tried again with ``experts_per_rank = "by_speed"``
(``sim.expert_split``) where that split is not the even one, i.e. where its EP groups span
GPUs of different speeds; the others count under ``RULE``. A faster plan joins the ranking
beside its even original, as the forced collectives of ``search/collsearch.py`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hetpar.errors import Infeasible
from hetpar.search.evaluate import Failed, Outcome
from hetpar.search.generate import SearchState
from hetpar.search.objectives import Objective
from hetpar.sim import expert_split
from hetpar.sim import network as net
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

RULE = "expert_split_even"
"""Top plans whose ``by_speed`` split is the even one (each EP coordinate on GPUs of one
speed): the same plan, not evaluated again (``SearchStats.removed``)."""


def speed_counts(model: ModelSpec, cluster: ClusterSpec, plan: Plan, precision: str,
                 seq: int) -> tuple[int, ...] | None:
    """The experts per EP rank ``by_speed`` gives ``plan``; None where it is the even split."""
    trial = replace(plan, experts_per_rank="by_speed")
    split = expert_split.plan_split(model, cluster, trial, net.topology(cluster), precision, seq)
    if split is None or len(set(split.counts)) == 1:
        return None
    return split.counts


def try_expert_splits(state: SearchState, model: ModelSpec, cluster: ClusterSpec,
                      job: Job, objective: Objective, top: int,
                      evaluate: Callable[[list[Plan]], list[Outcome]]) -> None:
    """Evaluate the ``top`` best EP plans again with more experts on faster GPUs; each such
    plan is a candidate, evaluated (``SearchStats.expert_split_evaluations``) or removed
    under ``RULE``. Nothing on a cluster of one GPU type or for a dense model."""
    if model.n_experts == 1 or len({g.gpu for g in cluster.node_groups}) < 2:
        return
    ranked = sorted(state.results, key=lambda r: tuple(-x for x in r.score))
    trials = []
    for r in ranked[:top]:
        if r.plan.degree("ep") == 1 or r.plan.experts_per_rank != "even":
            continue
        state.stats.candidates += 1
        try:
            counts = speed_counts(model, cluster, r.plan, job.precision,
                                  job.seq_len or model.seq_len)
        except Infeasible as e:  # ep does not divide its placed groups (ep_groups.expert_mesh)
            state.stats.infeasible[e.kind] += 1
            continue
        if counts is None:
            state.stats.removed[RULE] += 1
            continue
        trials.append((r, replace(r.plan, experts_per_rank="by_speed",
                                  name=f"{r.plan.name} by_speed")))
    outcomes = evaluate([p for _, p in trials]) if trials else []
    for (r, plan), out in zip(trials, outcomes, strict=True):
        state.stats.simulated += 1
        state.stats.expert_split_evaluations += 1
        if isinstance(out, Failed):
            state.stats.infeasible[out.kind] += 1
            continue
        if out.tokens_per_s <= r.evaluation.tokens_per_s * (1 + 1e-9):
            continue  # no faster than the even split: not a new plan
        state.results.append(replace(
            r, plan=plan, evaluation=out, key=f"{r.key},by_speed",
            score=objective.score(out.tokens_per_s, r.gpus, r.price_per_hour)))
