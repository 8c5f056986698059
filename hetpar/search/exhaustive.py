"""Brute-force reference: every structure, knob set, layer split and batch share of a space.

Only for spaces small enough to enumerate; the exactness test and benchmark compare the
planner's best plan with this optimum.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hetpar import schedules
from hetpar.errors import Infeasible
from hetpar.search.build import ORDER, _replicas, plan_name, uneven_uniform
from hetpar.search.candidates import Candidate, ClassCost, Knobs, knob_sets
from hetpar.search.costmodel import CostModel
from hetpar.search.generate import uniform_classes
from hetpar.search.rules import head_divisibility, knob_divisibility, tier_capacity
from hetpar.search.space import SearchSpace
from hetpar.search.split import Split
from hetpar.search.structures import Structure, enumerate_structures
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


@dataclass(frozen=True)
class Best:
    """The exhaustive optimum and how many plans were evaluated to find it."""

    tokens_per_s: float
    plan: Plan | None
    evaluated: int


def compositions(total: int, parts: int, least: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way to write ``total`` as ``parts`` integers each >= ``least``."""
    spare = total - parts * least
    if spare < 0:
        return
    for cuts in itertools.combinations(range(spare + parts - 1), parts - 1):
        prev, out = -1, []
        for c in (*cuts, spare + parts - 1):
            out.append(c - prev - 1 + least)
            prev = c
        yield tuple(out)


def _multisets(total: int, parts: int, least: int) -> Iterator[tuple[int, ...]]:
    """Non-increasing compositions (replicas of one class are interchangeable)."""

    def rec(left: int, n: int, cap: int) -> Iterator[tuple[int, ...]]:
        if n == 0:
            if left == 0:
                yield ()
            return
        for x in range(min(cap, left - least * (n - 1)), least - 1, -1):
            for rest in rec(left - x, n - 1, x):
                yield (x, *rest)

    yield from rec(total, parts, total)


def _share_vectors(counts: list[int], units: int) -> Iterator[list[int]]:
    """Per-replica unit counts (class-major), each >= 1, summing to ``units``."""

    def rec(ci: int, left: int) -> Iterator[list[int]]:
        if ci == len(counts):
            if left == 0:
                yield []
            return
        rest_min = sum(counts[ci + 1 :])
        for mine in range(counts[ci], left - rest_min + 1):
            for ms in _multisets(mine, counts[ci], 1):
                for tail in rec(ci + 1, left - mine):
                    yield [*ms, *tail]

    yield from rec(0, units)


def _plans(
    s: Structure, k: Knobs, model: ModelSpec, job: Job, unit: int, cluster: ClusterSpec
) -> Iterator[Plan]:
    if s.uniform is not None:
        yield from _uniform_plans(s, k, model, job, unit, cluster)
        return
    splits = [list(compositions(model.n_layers, c.pp, k.vpp)) for c in s.classes]
    units = job.global_batch // k.micro_batch // unit
    counts = [c.count for c in s.classes]
    for combo in itertools.product(*splits):
        classes = [
            ClassCost(
                cls=c,
                split=Split(layers=lay, rank_times=(), max_time=0.0, sum_time=0.0, objective=0.0),
                a_offset=0.0,
                b=0.0,
            )
            for c, lay in zip(s.classes, combo, strict=True)
        ]
        cand = Candidate(structure=s, knobs=k, gpus=0, classes=classes)
        for shares in _share_vectors(counts, units):
            per_rep = [
                (ci, n * unit)
                for ci, c in enumerate(s.classes)
                for n in shares[sum(counts[:ci]) : sum(counts[: ci + 1])]
            ]
            yield k.plan(precision=job.precision, name=plan_name(cand),
                         replicas=tuple(_replicas(cand, per_rep)),
                         global_batch=job.global_batch)


def _uniform_plans(
    s: Structure, k: Knobs, model: ModelSpec, job: Job, unit: int, cluster: ClusterSpec
) -> Iterator[Plan]:
    """The uniform layout: one plan with equal shares, else every uneven share vector."""
    assert s.uniform is not None
    tp, pp, dp = s.uniform
    units = job.global_batch // k.micro_batch // unit
    even = units % dp == 0
    base = k.plan(precision=job.precision, tp=tp, pp=pp, dp=dp, cp=k.cp,
                  global_batch=job.global_batch if even else dp * k.micro_batch,
                  order=ORDER[s.layout])
    if even:
        yield base
        return
    counts = [c.count for c in s.classes]
    vectors: Iterator[list[int]] = _share_vectors(counts, units)
    if len(counts) == 1:  # identical replicas: the most even shares minimise the slowest
        vectors = iter([[units // dp + (i < units % dp) for i in range(dp)]])
    for shares in vectors:
        per_rep = [(ci, n * unit) for ci, c in enumerate(s.classes)
                   for n in shares[sum(counts[:ci]) : sum(counts[: ci + 1])]]
        yield uneven_uniform(base, s.classes, per_rep, model, cluster, job.global_batch)


def exhaustive_best(
    model: ModelSpec, cluster: ClusterSpec, job: Job, space: SearchSpace, cost: CostModel
) -> Best:
    """The highest-throughput plan of ``space`` by evaluating every plan in it."""
    return exhaustive_bests(model, cluster, job, space, [cost])[0]


def exhaustive_bests(
    model: ModelSpec, cluster: ClusterSpec, job: Job, space: SearchSpace,
    costs: Sequence[CostModel],
) -> list[Best]:
    """``exhaustive_best`` under each of ``costs``, enumerating the space once (the tests
    compare the planner with the optimum under several seeded cost models of one space)."""
    bests: list[Best] = [Best(0.0, None, 0) for _ in costs]
    n = 0
    seq = job.seq_len or model.seq_len
    for cp in sorted(set(space.cp)):
        for s in enumerate_structures(cluster, space, cp, space.min_gpu_fraction,
                                      job.global_batch):
            try:
                s = uniform_classes(s, model, cluster, cp) if s.uniform is not None else s
            except Infeasible:
                continue
            if tier_capacity(s, cluster) or head_divisibility(s, model):
                continue
            any_tp = any(sl.tp > 1 for c in s.classes for sl in c.ranks)
            for k in knob_sets(space, cp, any_tp):
                unit = _unit(s, k)
                if knob_divisibility(s, k, model, job.global_batch, seq, unit):
                    continue
                for plan in _plans(s, k, model, job, unit, cluster):
                    n += 1
                    for i, cost in enumerate(costs):
                        try:
                            tps = cost.evaluate(plan).tokens_per_s
                        except Infeasible:
                            continue
                        if tps > bests[i].tokens_per_s:
                            bests[i] = Best(tps, plan, 0)
    return [Best(b.tokens_per_s, b.plan, n) for b in bests]


def _unit(s: Structure, k: Knobs) -> int:
    # Kept apart from the planner's share_unit on purpose (this module is the test oracle).
    tr = schedules.traits(k.schedule)
    out = 1
    for c in s.classes:
        u = tr.microbatch_unit(c.pp)
        out = out * u // _gcd(out, u)
    return out


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
