"""The planner: enumerate the space, prune by named rules, evaluate best-first, rank."""

from __future__ import annotations

import heapq
import os
import time
from dataclasses import dataclass, field, replace

from hetpar.errors import ConfigError, Infeasible
from hetpar.search.build import build_plan, plan_name
from hetpar.search.candidates import Candidate, Coster, knob_sets
from hetpar.search.costmodel import CostModel, Evaluation
from hetpar.search.evaluate import Failed, Progress, make_backend
from hetpar.search.objectives import Objective, Score
from hetpar.search.polish import polish
from hetpar.search.rules import SearchStats, head_divisibility, knob_divisibility, tier_capacity
from hetpar.search.space import SearchSpace
from hetpar.search.structures import ReplicaClass, Slot, Structure, enumerate_structures
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan, expand

CHUNK = 32
"""Plans evaluated between two updates of the pruning threshold; fixed so that results do
not depend on the number of workers or the backend."""


@dataclass(frozen=True, kw_only=True)
class Ranked:
    """One evaluated plan with its objective score."""

    plan: Plan
    evaluation: Evaluation
    score: Score
    gpus: int
    price_per_hour: float
    key: str
    bound: float


@dataclass
class SearchResult:
    """Ranked plans (best first), the statistics, and why no plan exists when none does."""

    ranked: list[Ranked]
    stats: SearchStats
    objective: Objective
    closest: str = ""
    evaluated: list[Ranked] = field(default_factory=list)


@dataclass
class _State:
    stats: SearchStats
    results: list[Ranked] = field(default_factory=list)
    closest: tuple[float, str] = (-1.0, "")

    def miss(self, rule: str, reason: str, cand: Candidate | None, bound: float = 0.0) -> None:
        self.stats.removed[rule] += 1
        if cand is not None and bound >= self.closest[0]:
            self.closest = (bound, f"{plan_name(cand)}: {rule}: {reason}")


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
    state = _State(SearchStats())
    seq = job.seq_len or model.seq_len
    coster = Coster(model, cluster, cost, job.global_batch, seq)
    backend = make_backend(cost, workers or os.cpu_count() or 1, ray_address)
    try:
        cands = _candidates(model, cluster, job, space, objective, coster, state)
    except BaseException:
        backend.close()
        raise
    bar = Progress(progress)
    try:
        _best_first(cands, coster, objective, model, job, top, backend, state, bar)
        _polish(cands, coster, objective, model, job, polish_top, backend, state)
    finally:
        backend.close()
        bar.close()
    state.stats.elapsed_s = time.perf_counter() - t0
    ranked = sorted(state.results, key=lambda r: (_neg(r.score), r.key))
    if not ranked:
        raise Infeasible("no plan", _no_plan_message(state, cluster))
    return SearchResult(
        ranked=ranked[:top], stats=state.stats, objective=objective, evaluated=ranked
    )


def _neg(score: Score) -> tuple[float, ...]:
    return tuple(-x for x in score)


def _no_plan_message(state: _State, cluster: ClusterSpec) -> str:
    fails = state.stats.removed + state.stats.infeasible
    counts = ", ".join(f"{k} {v}" for k, v in fails.most_common() if v)
    closest = state.closest[1] or "none"
    return (
        f"no plan fits {cluster.name} ({cluster.num_gpus} GPUs); candidates removed: "
        f"{counts or 'none'}; closest: {closest}"
    )


def _price(s: Structure, cp: int, cluster: ClusterSpec, objective: Objective) -> float:
    if not objective.needs_prices:
        return 0.0
    return sum(n * objective.price_of(cluster.group(g).gpu) for g, n in s.gpus(cp).items())


def _uniform_classes(s: Structure, model: ModelSpec, cluster: ClusterSpec, cp: int) -> Structure:
    """Lay a uniform (tp, pp, dp) out with ``expand`` and group its replicas into classes."""
    assert s.uniform is not None
    tp, pp, dp = s.uniform
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=dp)
    ex = expand(plan, model, cluster)
    counts: dict[tuple[Slot, ...], int] = {}
    for rep in ex.replicas:
        ranks = tuple(Slot(group=st.group, tp=st.tp) for st in rep.stages[:pp])
        counts[ranks] = counts.get(ranks, 0) + 1
    classes = tuple(ReplicaClass(count=n, ranks=r) for r, n in counts.items())
    return replace(s, classes=classes)


def _candidates(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    space: SearchSpace,
    objective: Objective,
    coster: Coster,
    state: _State,
) -> list[Candidate]:
    """Every structure x knob set, minus those the cheap rules remove."""
    min_frac = 0.0 if objective.name in ("min_gpus", "budget") else space.min_gpu_fraction
    out: list[Candidate] = []
    for cp in sorted(set(space.cp)):
        for s in enumerate_structures(cluster, space, cp, min_frac):
            if s.uniform is not None:
                any_tp = s.uniform[0] > 1
            else:
                any_tp = any(sl.tp > 1 for c in s.classes for sl in c.ranks)
            knobs = list(knob_sets(space, cp, any_tp))  # sequence parallelism only with TP
            state.stats.candidates += len(knobs)
            if s.uniform is not None:
                try:
                    s = _uniform_classes(s, model, cluster, cp)
                except Infeasible as e:
                    state.stats.removed[
                        "tier_capacity" if e.kind == "placement" else "divisibility"
                    ] += len(knobs)
                    continue
            why = tier_capacity(s, cluster)
            rule = "tier_capacity"
            if why is None:
                why, rule = head_divisibility(s, model), "divisibility"
            if why is not None:
                state.stats.removed[rule] += len(knobs)
                continue
            gpus = sum(s.gpus(cp).values())
            price = _price(s, cp, cluster, objective)
            for k in knobs:
                cand = Candidate(structure=s, knobs=k, gpus=gpus, price_per_hour=price)
                try:
                    _screen(cand, model, coster, objective, job, state, out)
                except Infeasible as e:  # the cost model rejects a stage outright
                    state.miss("unsupported", f"{e.kind}: {e.reason}", cand)
    return out


def _screen(
    cand: Candidate,
    model: ModelSpec,
    coster: Coster,
    objective: Objective,
    job: Job,
    state: _State,
    out: list[Candidate],
) -> None:
    s, k = cand.structure, cand.knobs
    seq = job.seq_len or model.seq_len
    why = knob_divisibility(s, k, model, job.global_batch, seq, coster.unit(s, k))
    if why is not None:
        state.miss("divisibility", why, cand)
        return
    if not objective.admissible(cand.price_per_hour):
        state.miss("budget", f"${cand.price_per_hour:.2f}/hour over budget", cand)
        return
    cand.bound = coster.cheap_bound(s, k)
    fit = coster.memory_fit(s, k)
    if fit < 1.0:
        # Closeness for the no-plan message: the share of the model that would fit (tier 1).
        state.miss(
            "memory",
            f"its GPUs hold about {fit:.0%} of the model's layers, "
            f"states and activations; it needs about {1 / max(fit, 1e-3):.1f}x the "
            "memory",
            cand,
            1.0 + fit,
        )
        return
    out.append(cand)


def _best_first(
    cands: list[Candidate],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    top: int,
    backend: object,
    state: _State,
    bar: Progress,
) -> None:
    """Pop candidates by upper bound; refine (DP split) then evaluate in fixed-size chunks;
    stop when the best bound left cannot beat the top-th best score found."""

    def bound_score(c: Candidate) -> Score:
        return objective.score(c.bound, c.gpus, c.price_per_hour)

    heap = [(_neg(bound_score(c)), c.key, i) for i, c in enumerate(cands)]
    heapq.heapify(heap)
    threshold: Score | None = None
    while heap:
        chunk: list[Candidate] = []
        while heap and len(chunk) < CHUNK:
            _, key, i = heapq.heappop(heap)
            c = cands[i]
            if threshold is not None and bound_score(c) < threshold:
                state.stats.removed["throughput_bound"] += 1 + len(heap)
                heap.clear()
                break
            if c.refined:
                chunk.append(c)
                continue
            if coster.refine(c, fixed=c.structure.uniform is not None):
                heapq.heappush(heap, (_neg(bound_score(c)), key, i))
            else:
                state.miss("memory", "no layer split fits its GPUs' memory", c, c.bound)
        if chunk:
            _evaluate(chunk, coster, objective, model, job, backend, state)
            scores = sorted((r.score for r in state.results), reverse=True)
            threshold = scores[top - 1] if len(scores) >= top else None
            best = f"{scores[0][-1]:,.0f}" if scores else "-"
            bar.update(state.stats.simulated, len(heap), best)


def _polish(
    cands: list[Candidate],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    n: int,
    backend: object,
    state: _State,
) -> None:
    """Hill-climb the ``n`` best non-uniform plans on the full cost model (see polish.py)."""
    by_key = {c.key: c for c in cands}
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
    state: _State,
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
