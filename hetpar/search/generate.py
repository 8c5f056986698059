"""Candidate generation: structures x knob sets, structural rules, bound groups, expansion."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hetpar.errors import Infeasible
from hetpar.search import experts
from hetpar.search.build import ORDER, plan_name
from hetpar.search.candidates import Candidate, Knobs, knob_sets
from hetpar.search.coster import Coster
from hetpar.search.costmodel import Evaluation
from hetpar.search.objectives import Objective, Score
from hetpar.search.rules import SearchStats, head_divisibility, knob_divisibility, tier_capacity
from hetpar.search.space import SearchSpace
from hetpar.search.structures import ReplicaClass, Slot, Structure, enumerate_structures
from hetpar.search.zeroscope import spans_groups
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import expand
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

_NEAR = 0.999
"""The most memory closeness a memory miss reports: below 1, as the candidate does not fit."""


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
    alternatives: tuple[tuple[str, float], ...] = ()
    """(network model, tokens/s) under each alternative model of the fabric (``--objective
    robust``, ``search/alternatives.py``); empty where it was not evaluated under them."""


@dataclass
class SearchState:
    """Statistics, evaluated plans and the closest miss, shared by the search phases."""

    stats: SearchStats
    results: list[Ranked] = field(default_factory=list)
    closest: tuple[float, str] = (-1.0, "")

    def miss(self, rule: str, reason: str, cand: Candidate | None, bound: float = 0.0) -> None:
        self.stats.removed[rule] += 1
        if cand is not None and bound >= self.closest[0]:
            self.closest = (bound, f"{plan_name(cand)}: {rule}: {reason}")


def plan_price(s: Structure, cp: int, cluster: ClusterSpec, objective: Objective) -> float:
    if not objective.needs_prices:
        return 0.0
    return sum(n * objective.price_of(cluster.group(g).gpu_name) for g, n in s.gpus(cp).items())


def uniform_classes(s: Structure, model: ModelSpec, cluster: ClusterSpec, cp: int) -> Structure:
    """Lay a uniform (tp, pp, dp) out with ``expand`` and group its replicas into classes."""
    assert s.uniform is not None
    tp, pp, dp = s.uniform
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=dp, order=ORDER[s.layout])
    ex = expand(plan, model, cluster)
    counts: dict[tuple[Slot, ...], int] = {}
    for rep in ex.replicas:
        ranks = tuple(Slot(group=st.group, tp=st.tp) for st in rep.stages[:pp])
        counts[ranks] = counts.get(ranks, 0) + 1
    classes = tuple(ReplicaClass(count=n, ranks=r, layout=s.layout) for r, n in counts.items())
    return replace(s, classes=classes)


@dataclass(slots=True)
class Group:
    """Knob sets of one structure that share an upper bound (same stage costs and vpp):
    they differ in schedule and ZeRO stage only, and are expanded when first popped."""

    structure: Structure
    variants: list[Knobs]
    gpus: int
    price: float
    bound: float


def _group_key(k: Knobs) -> tuple[object, ...]:
    return (k.cp, k.sequence_parallel, k.micro_batch, k.recompute, k.vpp, k.axes)


def generate_groups(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: Job,
    space: SearchSpace,
    objective: Objective,
    coster: Coster,
    state: SearchState,
) -> list[Group]:
    """Every structure x knob set, grouped by upper bound, minus what structural rules remove."""
    min_frac = 0.0 if objective.name in ("min_gpus", "budget") else space.min_gpu_fraction
    out: list[Group] = []
    for cp in sorted(set(space.cp)):
        # The knob sets and their bound buckets depend only on (cp, any TP): built once, not
        # once per structure (the wide space has 60k structures x 480 knob sets).
        dominated = _dominated_zero(space, coster)
        combos = experts.axis_combos(space, model)
        # keyed by (any TP, whether a DP group spans node groups: zero_scope matters)
        buckets = {(tp, sp): _buckets(space, cp, tp, dominated, sp, combos, model.n_layers)
                   for tp in (False, True) for sp in (False, True)}
        skipped = [0, 0]
        for s in enumerate_structures(cluster, space, cp, min_frac, job.global_batch, skipped):
            if s.uniform is not None:
                any_tp = s.uniform[0] > 1
            else:
                any_tp = any(sl.tp > 1 for c in s.classes for sl in c.ranks)
            _, n_all, n_dominated, _, n_deep = buckets[(any_tp, True)]  # SP only with TP
            state.stats.candidates += n_all + n_dominated + n_deep
            state.stats.removed["dominated"] += n_dominated
            if n_deep:  # a predicate counted only where it removed something
                state.stats.removed["divisibility"] += n_deep
                state.stats.predicates["layers_per_chunk"] += n_deep
            if s.uniform is not None:
                try:
                    s = uniform_classes(s, model, cluster, cp)
                except Infeasible as e:
                    rule = "tier_capacity" if e.kind == "placement" else "divisibility"
                    state.stats.removed[rule] += n_all
                    state.stats.predicates[e.kind] += n_all
                    continue
            bucket, n_knobs, _, n_moot, _ = buckets[(any_tp, spans_groups(s.classes))]
            state.stats.removed["zero_scope"] += n_moot
            why = tier_capacity(s, cluster)
            rule = "tier_capacity"
            if why is None:
                why, rule = head_divisibility(s, model), "divisibility"
            if why is not None:
                state.stats.removed[rule] += n_knobs
                state.stats.predicates[why.name] += n_knobs
                if state.closest[0] < -0.5:  # a reason to show if nothing gets closer
                    state.closest = (-0.5, f"{s.key()}: {why.name}: {why.reason}")
                continue
            _bucket(s, cp, bucket, job, objective, coster, state, out)
        # wrapped pipelines not generated (only two splits of the wrapping group are)
        wrap = sum(n * (buckets[(t, True)][1] + buckets[(t, True)][2] + buckets[(t, True)][4])
                   for t, n in zip((False, True), skipped, strict=True))
        state.stats.candidates += wrap
        state.stats.removed["wrap_limit"] += wrap
    return out


def _dominated_zero(space: SearchSpace, coster: Coster) -> set[int]:
    """ZeRO stages the cost model says are never faster than another stage of the space
    that needs no more memory (so it fits wherever they do): never better, not generated."""
    pairs = getattr(coster.cost, "zero_dominated", ())
    return {lo for lo, hi in pairs if lo in space.zero and hi in space.zero}


def _buckets(
    space: SearchSpace, cp: int, any_tp: bool, dominated: set[int], spans: bool,
    combos: list[tuple[tuple[str, int], ...]], n_layers: int,
) -> tuple[list[list[Knobs]], int, int, int, int]:
    """The knob sets of one CP degree grouped by ``_group_key`` (enumeration order kept),
    their number, how many ``dominated`` ZeRO stages removed, and (for structures whose
    DP groups each sit on one node group, ``not spans``) how many ZeRO-scope ``group``
    variants rule ``zero_scope`` removed: their plan is the ``all`` one, in the space too), and
    how many have more virtual stages than the model has layers (``layers_per_chunk``
    refuses them at every pp: removed before a bound is costed, whose p2p sum runs over the
    pp x vpp chunk boundaries: a fuzzed vpp of 95,985 searched for minutes)."""
    buckets: dict[tuple[object, ...], list[Knobs]] = {}
    n = gone = moot = deep = 0
    twin = "all" in space.zero_scope
    for k in knob_sets(space, cp, any_tp, combos):
        if k.zero in dominated:
            gone += 1
            continue
        if k.zero_scope == "group" and not spans and twin:
            moot += 1
            continue
        if k.vpp > n_layers:
            deep += 1
            continue
        buckets.setdefault(_group_key(k), []).append(k)
        n += 1
    return list(buckets.values()), n, gone, moot, deep


def _bucket(
    s: Structure,
    cp: int,
    buckets: list[list[Knobs]],
    job: Job,
    objective: Objective,
    coster: Coster,
    state: SearchState,
    out: list[Group],
) -> None:
    cluster, model = coster.cluster, coster.model
    gpus = sum(s.gpus(cp).values())
    price = plan_price(s, cp, cluster, objective)
    for variants in buckets:
        first = Candidate(structure=s, knobs=variants[0], gpus=gpus, price_per_hour=price)
        variants = _expert_rules(s, variants, model, cluster, job, first, state)
        if not variants:
            continue
        if not objective.admissible(price):
            state.miss("budget", f"${price:.2f}/hour over budget", first)
            state.stats.removed["budget"] += len(variants) - 1
            continue
        try:
            bound = coster.cheap_bound(s, variants)
        except Infeasible as e:  # the cost model rejects a stage outright
            state.miss("unsupported", f"{e.kind}: {e.reason}", first)
            state.stats.removed["unsupported"] += len(variants) - 1
            continue
        out.append(Group(structure=s, variants=variants, gpus=gpus, price=price, bound=bound))


def _expert_rules(s: Structure, variants: list[Knobs], model: ModelSpec, cluster: ClusterSpec,
                  job: Job, first: Candidate, state: SearchState) -> list[Knobs]:
    """The variants left after the expert axes' rules, before the cost model is asked: the
    mesh's divisibility of ep / etp (rule ``divisibility``; they share the axes) and the
    routed experts' memory (rule ``memory``), each counted under its predicate's name."""
    why = experts.structure_verdict(s, variants[0], model)
    if why is not None:
        state.miss("divisibility", why.reason, first)
        state.stats.removed["divisibility"] += len(variants) - 1
        state.stats.predicates[why.name] += len(variants)
        return []
    keep, why = experts.fitting(s, variants, model, cluster, job.precision,
                                job.optimizer)
    if why is not None:
        gone = len(variants) - len(keep)
        state.miss("memory", why.reason, first, 1.0)
        state.stats.removed["memory"] += gone - 1
        state.stats.predicates[why.name] += gone
    return keep


def expand_group(
    g: Group, model: ModelSpec, coster: Coster, job: Job, state: SearchState
) -> list[Candidate]:
    """The group's candidates that pass the divisibility and memory rules."""
    out = []
    seq = job.seq_len or model.seq_len
    s = g.structure
    for k in g.variants:
        cand = Candidate(structure=s, knobs=k, gpus=g.gpus, price_per_hour=g.price, bound=g.bound)
        why = knob_divisibility(s, k, model, job.global_batch, seq, coster.unit(s, k))
        if why is not None:
            state.miss("divisibility", why.reason, cand)
            state.stats.predicates[why.name] += 1
            continue
        fit = coster.memory_fit(s, k)
        if fit < 1.0:
            # Closeness for the no-plan message: how much of the memory it needs it has (at
            # most _NEAR), worked out only where it can still become the closest miss.
            if state.closest[0] > 1.0 + _NEAR:
                state.miss("memory", "", None)
                continue
            ratio = min(coster.memory_ratio(s, k), _NEAR)
            state.miss(
                "memory",
                f"its GPUs have about {ratio:.0%} of the memory its layers, states and "
                f"activations need; it needs at least {1 / max(ratio, 1e-3):.1f}x the memory",
                cand,
                1.0 + ratio,
            )
            continue
        out.append(cand)
    return out
