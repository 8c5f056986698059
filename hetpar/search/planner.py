"""The planner: enumerate the space, prune by named rules, evaluate best-first, rank."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hetpar import schedules
from hetpar.errors import ConfigError, Infeasible
from hetpar.search import alternatives
from hetpar.search.bestfirst import best_first, negate
from hetpar.search.candidates import Candidate
from hetpar.search.collsearch import try_collectives
from hetpar.search.coster import Coster
from hetpar.search.costmodel import CostModel
from hetpar.search.evaluate import Outcome, Progress, make_backend
from hetpar.search.expert_speed import try_expert_splits
from hetpar.search.generate import Group, Ranked, SearchState, generate_groups
from hetpar.search.objectives import Objective, check_reachable
from hetpar.search.polish import polish
from hetpar.search.robust import robust_score
from hetpar.search.rules import SearchStats
from hetpar.search.space import SearchSpace
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.collectives import NetworkModel
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

ROBUST_POOL = 20
"""The robust objective re-ranks at least this many plans of the highest expected
throughput (all plans whose bound came within reach of the 20th best are evaluated)."""


@dataclass
class SearchResult:
    """Ranked plans (best first), all evaluated plans, the statistics, and the closest
    rejected candidate with what it lacked (the no-plan message uses the same)."""

    ranked: list[Ranked]
    stats: SearchStats
    objective: Objective
    closest: str = ""
    evaluated: list[Ranked] = field(default_factory=list)
    cluster_gpus: int = 0
    """GPUs in the cluster (the best plan may leave some idle; ``explain.idle`` says why)."""
    network_models: tuple[NetworkModel, ...] = ()
    """The alternative network models the robust objective priced its pool under."""


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
    if cost is None:  # the bound is the simulator's physics; a custom cost model has its own
        check_reachable(objective, model, cluster, job.seq_len or model.seq_len)
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
    alts: tuple[NetworkModel, ...] = ()
    # robust: search by tokens/s keeping more plans, then re-rank them by the low quantile
    keep = max(4 * top, ROBUST_POOL) if objective.name == "robust" else top
    try:
        expanded = best_first(groups, coster, objective, model, job, keep, backend, state, bar)
        wide = _widen_vpp(expanded, space, coster, model, top, state)
        expanded.update(best_first(wide, coster, objective, model, job, keep, backend, state,
                                    bar, base=len(groups)))
        _polish(expanded, coster, objective, model, job, polish_top, backend, state)
        try_collectives(state, space, objective, keep, backend.map)
        try_expert_splits(state, model, cluster, job, objective, keep, backend.map)
        if objective.name == "robust":
            if getattr(cost, "prices_networks", False):
                alts = alternatives.models(space)
            _robust_rerank(state, objective, alts, keep, backend.map_under)
    finally:
        backend.close()
        bar.close()
    state.stats.elapsed_s = time.perf_counter() - t0
    ranked = sorted(state.results, key=lambda r: (negate(r.score), r.key))
    if not ranked:
        raise Infeasible("no plan", _no_plan_message(state, cluster))
    return SearchResult(
        ranked=ranked[:top],
        stats=state.stats,
        objective=objective,
        evaluated=ranked,
        closest=state.closest[1],
        cluster_gpus=cluster.num_gpus,
        network_models=alts,
    )


def _robust_rerank(state: SearchState, objective: Objective,
                   alts: Sequence[NetworkModel] = (), pool: int = ROBUST_POOL,
                   map_under: Callable[..., list[Outcome]] | None = None) -> None:
    """Score every plan by its low quantile of tokens/s, then its expectation; with
    alternative network models (``search/alternatives.py``), first by its worst loss to the
    best plan under any model, over the ``pool`` plans of the highest low quantile, each
    priced under every model (plans outside the pool rank after those in it)."""
    u = objective.uncertainty
    q = {id(r): robust_score(r.evaluation, u) for r in state.results}
    if not alts or map_under is None:
        state.results = [replace(r, score=(0.0, q[id(r)], r.evaluation.tokens_per_s))
                         for r in state.results]
        return
    order = sorted(state.results, key=lambda r: (-q[id(r)], -r.evaluation.tokens_per_s, r.key))
    priced = alternatives.price(order[:pool], alts, map_under)
    tops = alternatives.best(priced)
    state.results = [
        replace(r, score=(-alternatives.worst(r, tops), q[id(orig)], r.evaluation.tokens_per_s))
        for r, orig in zip(priced, order, strict=False)
    ] + [replace(r, score=(-2.0, q[id(r)], r.evaluation.tokens_per_s)) for r in order[pool:]]


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


def _widen_vpp(
    cands: dict[tuple[int, int], Candidate],
    space: SearchSpace,
    coster: Coster,
    model: ModelSpec,
    top: int,
    state: SearchState,
) -> list[Group]:
    """Virtual-stage counts beyond the space's, where the bound says they could win.

    When the space allows a looped schedule (its ``Traits.chunks``), the top pipelined
    plans' structures and knobs are tried with it at every other vpp the layers allow (at least
    one layer per chunk); each becomes a group for a second best-first pass, which evaluates
    only those whose bound beats the top-th plan found so far.
    """
    out: list[Group] = []
    looped = [n for n in space.schedule if schedules.traits(n).chunks == "looped"]
    if not space.widen_vpp or not looped:
        return out
    by_key = {c.key: c for c in cands.values()}
    ranked = sorted(state.results, key=lambda r: (negate(r.score), r.key))
    seen: set[tuple[object, ...]] = set()
    # The top plans that can loop (every pipeline deeper than 1): a faster plan without a
    # pipeline (a ZeRO-scope 'group' split on a mixed cluster) must not use up the quota.
    pipelined = []
    for r in ranked:
        c = by_key.get(r.key)
        if c is None:
            continue
        s = c.structure
        pps = [s.uniform[1]] if s.uniform is not None else [cl.pp for cl in s.classes]
        if min(pps) >= 2:
            pipelined.append((c, pps))
            if len(pipelined) == top:
                break
    for c, pps in pipelined:
        s = c.structure
        for v in range(2, model.n_layers // max(pps) + 1):
            for name in looped:
                k = c.knobs._replace(vpp=v, schedule=name)
                if v in space.vpp or (s, k) in seen:
                    continue
                seen.add((s, k))
                try:
                    bound = coster.cheap_bound(s, [k])
                except Infeasible:
                    continue
                out.append(Group(structure=s, variants=[k], gpus=c.gpus,
                                 price=c.price_per_hour, bound=bound))
                state.stats.widened_vpp.add(v)
    state.stats.candidates += len(out)
    state.stats.widened += len(out)
    return out


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
    ranked = sorted(state.results, key=lambda r: (negate(r.score), r.key))
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
