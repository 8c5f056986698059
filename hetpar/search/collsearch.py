"""The collectives dimension: the top plans with each forced NCCL algorithm / protocol / DP
sync of the space, evaluated only where a bound says the choice could win."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

from hetpar.search.costmodel import Evaluation
from hetpar.search.evaluate import Failed, Outcome
from hetpar.search.generate import Ranked, SearchState
from hetpar.search.objectives import Objective, Score
from hetpar.search.space import SearchSpace
from hetpar.sim import breakdown
from hetpar.specs.collectives import Collectives
from hetpar.specs.plan import Plan

RULE = "collectives_bound"
"""The pruning rule's name in ``SearchStats.removed`` (``rules.RULES``)."""


def choices(space: SearchSpace) -> list[Collectives]:
    """Every forced combination the space allows (all-``auto``, the plans' own, left out)."""
    out = [Collectives(algorithm=a, protocol=p, dp_sync=d)
           for a, p, d in itertools.product(space.algorithm, space.protocol, space.dp_sync)]
    # fewest forced settings first: of choices that price alike, the simplest is kept
    return sorted((c for c in out if not c.is_auto),
                  key=lambda c: sum(v != "auto" for v in (c.algorithm, c.protocol, c.dp_sync)))


def saving_bound(ev: Evaluation, pipelined: bool) -> float:
    """The most seconds any collective choice can take off ``ev``'s iteration: its exposed
    network time (a faster collective hides at most all of it), and with a pipeline the
    bubble too (TP traffic lengthens every stage's micro-batch, so the bubble shrinks with
    it); compute, the optimizer and the fixed overhead do not depend on the collectives."""
    bd = ev.breakdown
    net = sum(bd.get(t.key, 0.0) for t in breakdown.terms() if t.kind == "network")
    return net + (bd.get("bubble", 0.0) if pipelined else 0.0)


def try_collectives(
    state: SearchState,
    space: SearchSpace,
    objective: Objective,
    top: int,
    evaluate: Callable[[list[Plan]], list[Outcome]],
) -> None:
    """Evaluate the ``top`` best plans (all-``auto``) with every forced choice of the space
    whose bound beats the ``top``-th plan's score (the others count under ``RULE``); a
    forced plan faster than its all-``auto`` original joins the ranking beside it."""
    forced = choices(space)
    ranked = sorted(state.results, key=lambda r: tuple(-x for x in r.score))
    threshold: Score | None = ranked[top - 1].score if len(ranked) >= top else None
    trials: list[tuple[Ranked, Plan]] = []
    for r in ranked[:top]:
        if r.plan.collectives is not None:
            continue
        ev = r.evaluation
        pipelined = r.plan.pp > 1 or any(len(x.stages) > 1 for x in r.plan.replicas)
        saving = saving_bound(ev, pipelined)
        rest = max(ev.iteration_time_s - saving, 1e-12)
        bound = objective.score(ev.tokens_per_s * ev.iteration_time_s / rest, r.gpus,
                                r.price_per_hour)
        for c in forced:
            if saving <= 0 or (threshold is not None and bound <= threshold):
                state.stats.removed[RULE] += 1
                continue
            trials.append((r, replace(r.plan, collectives=c, name=f"{r.plan.name} {c.label()}")))
    state.stats.candidates += len(forced) * min(top, len(ranked))
    outcomes = evaluate([p for _, p in trials]) if trials else []
    kept: dict[str, list[float]] = {}
    for (r, plan), out in zip(trials, outcomes, strict=True):
        state.stats.simulated += 1
        state.stats.collective_evaluations += 1
        if isinstance(out, Failed):
            state.stats.infeasible[out.kind] += 1
            continue
        if out.tokens_per_s <= r.evaluation.tokens_per_s * (1 + 1e-9):
            continue  # forcing it gains nothing over the library's own choice: not a new plan
        same = kept.setdefault(r.key, [])
        if any(abs(out.tokens_per_s - t) <= 1e-9 * t for t in same):
            continue  # a simpler forced choice of the same plan prices the same
        same.append(out.tokens_per_s)
        assert plan.collectives is not None
        state.results.append(replace(
            r, plan=plan, evaluation=out, key=f"{r.key},{plan.collectives.label()}",
            score=objective.score(out.tokens_per_s, r.gpus, r.price_per_hour)))
