"""The planner: enumerate the space, prune by named rules, evaluate best-first, rank."""

from __future__ import annotations

import heapq
import os
import time
from dataclasses import dataclass, field, replace

from hetpar.errors import ConfigError, Infeasible
from hetpar.search.build import build_plan, plan_name
from hetpar.search.candidates import Candidate
from hetpar.search.coster import Coster
from hetpar.search.costmodel import CostModel
from hetpar.search.evaluate import Failed, Progress, make_backend
from hetpar.search.generate import Group, Ranked, SearchState, expand_group, generate_groups
from hetpar.search.objectives import Objective, Score
from hetpar.search.polish import polish
from hetpar.search.rules import SearchStats
from hetpar.search.space import SearchSpace
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

CHUNK = 32
"""Plans evaluated between two updates of the pruning threshold; fixed so that results do
not depend on the number of workers or the backend."""


@dataclass
class SearchResult:
    """Ranked plans (best first), all evaluated plans, the statistics, and the closest
    rejected candidate with what it lacked (the no-plan message uses the same)."""

    ranked: list[Ranked]
    stats: SearchStats
    objective: Objective
    closest: str = ""
    evaluated: list[Ranked] = field(default_factory=list)


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    space: SearchSpace | None = None,
    *,
    objective: Objective | None = None,
    workers: int | None = None,
    top: int = 5,
    cost: CostModel | None = None,
    ray_address: str | None = None,
    progress: bool = False,
    polish_top: int = 3,
) -> SearchResult:
    """Find the best plans for ``model`` on ``cluster`` for ``job``.

    ``cost`` defaults to the simulator. Raises ``Infeasible('no plan', ...)`` naming the
    closest candidate and what it lacks when nothing fits.
    """
    space = space or SearchSpace()
    objective = objective or Objective()
    if top < 1:
        raise ConfigError(f"--top must be >= 1, got {top}")
    if cost is None:
        from hetpar.search.simcost import SimCostModel

        cost = SimCostModel(model, cluster, job)
    t0 = time.perf_counter()
    state = SearchState(SearchStats())
    seq = job.seq_len or model.seq_len
    coster = Coster(model, cluster, cost, job.global_batch, seq)
    backend = make_backend(cost, workers or os.cpu_count() or 1, ray_address)
    try:
        groups = generate_groups(model, cluster, job, space, objective, coster, state)
    except BaseException:
        backend.close()
        raise
    bar = Progress(progress)
    try:
        expanded = _best_first(groups, coster, objective, model, job, top, backend, state, bar)
        _polish(expanded, coster, objective, model, job, polish_top, backend, state)
    finally:
        backend.close()
        bar.close()
    state.stats.elapsed_s = time.perf_counter() - t0
    ranked = sorted(state.results, key=lambda r: (_neg(r.score), r.key))
    if not ranked:
        raise Infeasible("no plan", _no_plan_message(state, cluster))
    return SearchResult(
        ranked=ranked[:top],
        stats=state.stats,
        objective=objective,
        evaluated=ranked,
        closest=state.closest[1],
    )


def _neg(score: Score) -> tuple[float, ...]:
    return tuple(-x for x in score)


def _no_plan_message(state: SearchState, cluster: ClusterSpec) -> str:
    fails = state.stats.removed + state.stats.infeasible
    counts = ", ".join(f"{k} {v}" for k, v in fails.most_common() if v)
    named = ", ".join(f"{k} {v}" for k, v in state.stats.predicates.most_common() if v)
    counts += f" (feasibility predicates: {named})" if named else ""
    closest = state.closest[1] or "none"
    return (
        f"no plan fits {cluster.name} ({cluster.num_gpus} GPUs); candidates removed: "
        f"{counts or 'none'}; closest: {closest}"
    )


def _best_first(
    groups: list[Group],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    top: int,
    backend: object,
    state: SearchState,
    bar: Progress,
) -> dict[tuple[int, int], Candidate]:
    """Pop groups and candidates by upper bound (ties: enumeration order); expand groups,
    refine candidates (DP split), evaluate them in fixed-size chunks; stop when the best
    bound left cannot beat the top-th best score found. Returns the expanded candidates."""

    def score(bound: float, gpus: int, price: float) -> Score:
        return objective.score(bound, gpus, price)

    heap = [(_neg(score(g.bound, g.gpus, g.price)), gi, -1) for gi, g in enumerate(groups)]
    heapq.heapify(heap)
    cands: dict[tuple[int, int], Candidate] = {}
    threshold: Score | None = None
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
                    cands[(gi, v)] = c
                    heapq.heappush(heap, (neg, gi, v))
                continue
            c = cands[(gi, vi)]
            if c.refined:
                chunk.append(c)
            elif coster.refine(c, fixed=c.structure.uniform is not None):
                heapq.heappush(heap, (_neg(score(c.bound, c.gpus, c.price_per_hour)), gi, vi))
            else:
                state.miss("memory", "no layer split fits its GPUs' memory", c, c.bound)
        if chunk:
            _evaluate(chunk, coster, objective, model, job, backend, state)
            scores = sorted((r.score for r in state.results), reverse=True)
            threshold = scores[top - 1] if len(scores) >= top else None
            best = f"{scores[0][-1]:,.0f}" if scores else "-"
            bar.update(state.stats.simulated, len(heap), best)
    return cands


def _polish(
    cands: dict[tuple[int, int], Candidate],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    n: int,
    backend: object,
    state: SearchState,
) -> None:
    """Hill-climb the ``n`` best non-uniform plans on the full cost model (see polish.py)."""
    by_key = {c.key: c for c in cands.values()}
    ranked = sorted(state.results, key=lambda r: (_neg(r.score), r.key))
    for r in ranked[:n]:
        c = by_key[r.key]
        if c.structure.uniform is not None:
            continue
        unit = coster.unit(c.structure, c.knobs)
        plan, ev, spent = polish(c, r.evaluation, model, job, unit, backend.map)  # type: ignore[attr-defined]
        state.stats.simulated += spent
        state.stats.polish_evaluations += spent
        if plan is None:
            continue
        plan = replace(plan, name=plan.name + " polished")
        score = objective.score(ev.tokens_per_s, c.gpus, c.price_per_hour)
        i = state.results.index(r)
        state.results[i] = replace(r, plan=plan, evaluation=ev, score=score)


def _evaluate(
    chunk: list[Candidate],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    backend: object,
    state: SearchState,
) -> None:
    plans: list[tuple[Candidate, Plan]] = []
    for c in chunk:
        try:
            plans.append((c, build_plan(c, model, job, coster.unit(c.structure, c.knobs))))
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
