"""The best-first pass: pop groups and candidates by bound, refine, evaluate in chunks."""

from __future__ import annotations

import heapq

from hetpar.errors import Infeasible
from hetpar.search.build import build_plan, plan_name
from hetpar.search.candidates import Candidate
from hetpar.search.coster import Coster
from hetpar.search.evaluate import Failed, Progress
from hetpar.search.generate import Group, Ranked, SearchState, expand_group
from hetpar.search.objectives import Objective, Score
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

CHUNK = 32
"""Plans evaluated between two updates of the pruning threshold; fixed so that results do
not depend on the number of workers or the backend."""


def negate(score: Score) -> tuple[float, ...]:
    """The score negated, so that ``heapq`` and ``sorted`` put the best first."""
    return tuple(-x for x in score)


def best_first(
    groups: list[Group],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    top: int,
    backend: object,
    state: SearchState,
    bar: Progress,
    base: int = 0,
) -> dict[tuple[int, int], Candidate]:
    """Pop groups and candidates by upper bound (ties: enumeration order); expand groups,
    refine candidates (DP split), evaluate them in fixed-size chunks; stop when the best
    bound left cannot beat the top-th best score found (also those found before this
    call). Returns the expanded candidates, keyed by (``base`` + group, variant)."""

    def score(bound: float, gpus: int, price: float) -> Score:
        return objective.score(bound, gpus, price)

    heap = [(negate(score(g.bound, g.gpus, g.price)), gi, -1) for gi, g in enumerate(groups)]
    heapq.heapify(heap)
    cands: dict[tuple[int, int], Candidate] = {}
    found = sorted((r.score for r in state.results), reverse=True)
    threshold: Score | None = found[top - 1] if len(found) >= top else None
    while heap:
        chunk: list[Candidate] = []
        while heap and len(chunk) < CHUNK:
            neg, gi, vi = heapq.heappop(heap)
            if threshold is not None and tuple(-x for x in neg) < threshold:
                left = [(g, v) for _, g, v in heap] + [(gi, vi)]
                state.stats.removed["throughput_bound"] += sum(
                    len(groups[g].variants) if v < 0 else 1 for g, v in left
                )
                heap.clear()
                break
            if vi < 0:
                for c in expand_group(groups[gi], model, coster, job, state):
                    v = groups[gi].variants.index(c.knobs)
                    cands[(base + gi, v)] = c
                    heapq.heappush(heap, (neg, gi, v))
                continue
            c = cands[(base + gi, vi)]
            if c.refined:
                chunk.append(c)
            elif coster.refine(c, fixed=c.structure.uniform is not None):
                heapq.heappush(heap, (negate(score(c.bound, c.gpus, c.price_per_hour)), gi, vi))
            else:
                state.miss("memory", "no layer split fits its GPUs' memory", c, c.bound)
        if chunk:
            evaluate(chunk, coster, objective, model, job, backend, state)
            scores = sorted((r.score for r in state.results), reverse=True)
            threshold = scores[top - 1] if len(scores) >= top else None
            best = f"{scores[0][-1]:,.0f}" if scores else "-"
            bar.update(state.stats.simulated, len(heap), best)
    return cands


def evaluate(
    chunk: list[Candidate],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    backend: object,
    state: SearchState,
) -> None:
    """Build and evaluate ``chunk``'s plans; record results, infeasible counts, closest."""
    plans: list[tuple[Candidate, Plan]] = []
    for c in chunk:
        try:
            unit = coster.unit(c.structure, c.knobs)
            plans.append((c, build_plan(c, model, job, unit, cluster=coster.cluster)))
        except Infeasible as e:
            state.stats.infeasible[e.kind] += 1
            state.closest = max(state.closest, (c.bound, f"{plan_name(c)}: {e}"))
    outcomes = backend.map([p for _, p in plans])  # type: ignore[attr-defined]
    for (c, plan), out in zip(plans, outcomes, strict=True):
        state.stats.simulated += 1
        if isinstance(out, Failed):
            state.stats.infeasible[out.kind] += 1
            if c.bound > state.closest[0]:
                state.closest = (c.bound, f"{plan.name}: {out.kind}: {out.reason}")
            continue
        if out.tokens_per_s > c.bound * (1 + 1e-9):
            state.stats.bound_violations += 1
        score = objective.score(out.tokens_per_s, c.gpus, c.price_per_hour)
        state.results.append(
            Ranked(
                plan=plan,
                evaluation=out,
                score=score,
                gpus=c.gpus,
                price_per_hour=c.price_per_hour,
                key=c.key,
                bound=c.bound,
            )
        )
