"""The planner: enumerate the space, prune by named rules, evaluate best-first, rank."""

from __future__ import annotations

import heapq
import os
import time
from dataclasses import dataclass, field, replace

from hetpar.errors import ConfigError, Infeasible
from hetpar.search.build import build_plan, plan_name
from hetpar.search.candidates import Candidate, Coster, Knobs, knob_sets
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
        groups = _candidates(model, cluster, job, space, objective, coster, state)
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


@dataclass(slots=True)
class _Group:
    """Knob sets of one structure that share an upper bound (same stage costs and vpp):
    they differ in schedule and ZeRO stage only, and are expanded when first popped."""

    structure: Structure
    variants: list[Knobs]
    gpus: int
    price: float
    bound: float


def _group_key(k: Knobs) -> tuple[object, ...]:
    return (k.cp, k.sequence_parallel, k.micro_batch, k.recompute, k.vpp)


def _candidates(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    space: SearchSpace,
    objective: Objective,
    coster: Coster,
    state: _State,
) -> list[_Group]:
    """Every structure x knob set, grouped by upper bound, minus what structural rules remove."""
    min_frac = 0.0 if objective.name in ("min_gpus", "budget") else space.min_gpu_fraction
    out: list[_Group] = []
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
                    rule = "tier_capacity" if e.kind == "placement" else "divisibility"
                    state.stats.removed[rule] += len(knobs)
                    continue
            why = tier_capacity(s, cluster)
            rule = "tier_capacity"
            if why is None:
                why, rule = head_divisibility(s, model), "divisibility"
            if why is not None:
                state.stats.removed[rule] += len(knobs)
                continue
            _group(s, knobs, cluster, objective, coster, state, out)
    return out


def _group(
    s: Structure,
    knobs: list[Knobs],
    cluster: ClusterSpec,
    objective: Objective,
    coster: Coster,
    state: _State,
    out: list[_Group],
) -> None:
    gpus = sum(s.gpus(knobs[0].cp).values())
    price = _price(s, knobs[0].cp, cluster, objective)
    buckets: dict[tuple[object, ...], list[Knobs]] = {}
    for k in knobs:
        buckets.setdefault(_group_key(k), []).append(k)
    for variants in buckets.values():
        first = Candidate(structure=s, knobs=variants[0], gpus=gpus, price_per_hour=price)
        if not objective.admissible(price):
            state.miss("budget", f"${price:.2f}/hour over budget", first)
            state.stats.removed["budget"] += len(variants) - 1
            continue
        try:
            bound = coster.cheap_bound(s, variants[0])
        except Infeasible as e:  # the cost model rejects a stage outright
            state.miss("unsupported", f"{e.kind}: {e.reason}", first)
            state.stats.removed["unsupported"] += len(variants) - 1
            continue
        out.append(_Group(structure=s, variants=variants, gpus=gpus, price=price, bound=bound))


def _expand(
    g: _Group, model: ModelSpec, coster: Coster, job: Job, state: _State
) -> list[Candidate]:
    """The group's candidates that pass the divisibility and memory rules."""
    out = []
    seq = job.seq_len or model.seq_len
    s = g.structure
    for k in g.variants:
        cand = Candidate(structure=s, knobs=k, gpus=g.gpus, price_per_hour=g.price, bound=g.bound)
        why = knob_divisibility(s, k, model, job.global_batch, seq, coster.unit(s, k))
        if why is not None:
            state.miss("divisibility", why, cand)
            continue
        fit = coster.memory_fit(s, k)
        if fit < 1.0:
            # Closeness for the no-plan message: the share of the model that would fit.
            state.miss(
                "memory",
                f"its GPUs hold about {fit:.0%} of the model's layers, "
                f"states and activations; it needs about {1 / max(fit, 1e-3):.1f}x "
                "the memory",
                cand,
                1.0 + fit,
            )
            continue
        out.append(cand)
    return out


def _best_first(
    groups: list[_Group],
    coster: Coster,
    objective: Objective,
    model: ModelSpec,
    job: Job,
    top: int,
    backend: object,
    state: _State,
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
                for c in _expand(groups[gi], model, coster, job, state):
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
    state: _State,
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
