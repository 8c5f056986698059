"""Enumeration of plan structures: which GPUs form which pipeline ranks of which replicas.

The structures themselves (``Slot``, ``ReplicaClass``, ``Structure``, ``layout_offsets``,
``with_layouts``) live in ``search/skeleton.py`` and are re-exported here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from hetpar.search.skeleton import (
    Layout,
    ReplicaClass,
    Slot,
    Structure,
    layout_offsets,
    with_layouts,
)
from hetpar.search.space import SearchSpace
from hetpar.specs.cluster import ClusterSpec

MAX_PERMUTED_GROUPS = 3
SUBSET_SAVING = 0.95
"""A uniform subset is generated when it needs at most this fraction of the replicas."""

__all__ = ["MAX_PERMUTED_GROUPS", "SUBSET_SAVING", "Layout", "ReplicaClass", "Slot", "Structure",
           "enumerate_structures", "group_options", "layout_offsets", "mixed_structures",
           "split_structures", "tp_fits", "uniform_structures", "with_layouts"]


def _tp_options(space: SearchSpace, domain: int, cp: int) -> list[int]:
    # Every TP degree is generated; the planner's `tier_capacity` rule removes (and counts)
    # those that do not fit one scale-up domain.
    return sorted(set(space.tp))


def tp_fits(tp: int, domain: int) -> bool:
    """Tier rule: a TP group must sit inside one scale-up domain (TP traffic needs NVLink)."""
    return tp <= domain and domain % tp == 0


def uniform_structures(
    cluster: ClusterSpec, space: SearchSpace, cp: int, min_fraction: float = 0.0,
    global_batch: int = 0,
) -> Iterator[Structure]:
    """Same (tp, pp, dp) over the cluster's GPUs in group order, equal layer splits.

    dp uses every GPU when tp*pp*cp divides the cluster. With ``global_batch`` also the
    fewest replicas
    that keep the slowest replica's share: 280 replicas sharing 512 micro-batches take 2
    each at most, as 256 replicas do, so 256 replicas on fewer GPUs are generated too
    (when that saves at least 1 - ``SUBSET_SAVING`` of the replicas).
    """
    total = cluster.num_gpus
    for tp in sorted(set(space.tp)):
        for pp in sorted(set(space.pp)):
            width = tp * pp * cp
            most = total // width
            if most < 1:
                continue
            # Only layouts on every GPU, or the subsets below (idle GPUs otherwise are the
            # split family's, per group).
            dps = {most} if most * width == total else set()
            for mb in sorted(set(space.micro_batch)) if global_batch else ():
                units = global_batch // mb
                if units < most:  # more replicas than micro-batches cannot all work
                    dps.add(units)
                else:
                    fewest = -(-units // -(-units // most))
                    if fewest <= SUBSET_SAVING * most:
                        dps.add(fewest)
            for dp in sorted(dps, reverse=True):
                if dp <= most and dp * width >= min_fraction * total:
                    yield Structure(family="uniform", classes=(), uniform=(tp, pp, dp))


def _orders(groups: list[str]) -> list[tuple[str, ...]]:
    if len(groups) <= MAX_PERMUTED_GROUPS:
        return list(itertools.permutations(groups))
    return [tuple(groups), tuple(reversed(groups))]


def mixed_structures(
    cluster: ClusterSpec, space: SearchSpace, cp: int, skipped: list[int] | None = None
) -> Iterator[Structure]:
    """Identical replicas whose pipelines cross node groups, using every GPU of those groups.

    With D replicas and TP degree t_g on group g, group g contributes c_g / (D t_g cp)
    ranks to every pipeline; D runs over the common divisors so nothing idles. With the
    ``wrapped`` family also pipelines in which a group appears twice (``_wrapped``).
    """
    wrapped = "wrapped" in space.families
    hybrid = "hybrid" in space.families
    if "mixed" not in space.families and not wrapped and not hybrid:
        return
    groups = list(cluster.node_groups)
    for k in range(2, len(groups) + 1):
        for subset in itertools.combinations(groups, k):
            tp_lists = [_tp_options(space, g.domain_size, cp) for g in subset]
            for tps in itertools.product(*tp_lists):
                units = [
                    g.num_gpus // (t * cp) if g.num_gpus % (t * cp) == 0 else 0
                    for g, t in zip(subset, tps, strict=True)
                ]
                if 0 in units:
                    continue
                if hybrid:
                    yield from _hybrid(subset, tps, units, space, cp)
                for d in _common_divisors(units):
                    if space.dp and d not in space.dp:
                        continue
                    ranks_per = {g.name: u // d for g, u in zip(subset, units, strict=True)}
                    if sum(ranks_per.values()) > space.max_pp:
                        continue
                    tp_of = {g.name: t for g, t in zip(subset, tps, strict=True)}
                    for order in _orders([g.name for g in subset]):
                        ranks = tuple(
                            Slot(group=n, tp=tp_of[n]) for n in order for _ in range(ranks_per[n])
                        )
                        if "mixed" in space.families:
                            yield Structure(
                                family="mixed", classes=(ReplicaClass(count=d, ranks=ranks),)
                            )
                        if wrapped:
                            yield from _wrapped(ranks, d, skipped)


def _hybrid(
    subset: Sequence[object], tps: Sequence[int], units: list[int], space: SearchSpace, cp: int
) -> Iterator[Structure]:
    """Mixed pipelines whose replica count D leaves some of a group's units over, plus
    single-type replicas of the same depth on what is left (fewer ranks if the rest is
    smaller): replicas of one stage then mix GPU types, as in Sailor's 24x[V100/tp4, A100]
    + 3x[A100, A100]. D runs over the counts that are not common divisors (those are the
    ``mixed`` family's); what is left after the single-type replicas idles."""
    common = set(_common_divisors(units))
    names = [g.name for g in subset]  # type: ignore[attr-defined]
    for d in range(1, min(units) + 1):
        if d in common or (space.dp and d not in space.dp):
            continue
        per = [u // d for u in units]
        depth = sum(per)
        if depth > space.max_pp:
            continue
        for order in _orders(names):
            idx = [names.index(n) for n in order]
            ranks = tuple(Slot(group=names[i], tp=tps[i]) for i in idx for _ in range(per[i]))
            classes = [ReplicaClass(count=d, ranks=ranks)]
            for i, (u, p) in enumerate(zip(units, per, strict=True)):
                rest = u - d * p
                depth_i = min(depth, rest)
                if rest and depth_i:
                    slot = Slot(group=names[i], tp=tps[i])
                    classes.append(ReplicaClass(count=rest // depth_i, ranks=(slot,) * depth_i))
            yield Structure(family="hybrid", classes=tuple(classes))


def _wrapped(ranks: tuple[Slot, ...], d: int, skipped: list[int] | None) -> Iterator[Structure]:
    """The pipeline ``ranks`` with its first group's ranks split around the others (V100 ->
    A100 -> V100, as Sailor's plans do). Of the n - 1 ways to split that group's n ranks,
    the two extremes are generated (one rank first or one rank last); the others are
    counted in ``skipped`` (index 1 if any rank has TP; the ``wrap_limit`` pruning count)."""
    first = ranks[0]
    n = next((i for i, r in enumerate(ranks) if r != first), len(ranks))
    if n < 2 or n == len(ranks):
        return
    cuts = sorted({1, n - 1})
    if skipped is not None:  # per "any TP" (their knob sets differ in number)
        skipped[any(r.tp > 1 for r in ranks)] += n - 1 - len(cuts)
    for a in cuts:
        out = ranks[:a] + ranks[n:] + ranks[a:n]
        yield Structure(family="wrapped", classes=(ReplicaClass(count=d, ranks=out),))


def _common_divisors(values: list[int]) -> list[int]:
    lo = min(values)
    return [d for d in range(1, lo + 1) if all(v % d == 0 for v in values)]


def group_options(
    cluster: ClusterSpec, space: SearchSpace, cp: int, min_fraction: float
) -> dict[str, list[ReplicaClass]]:
    """Per node group: the single-type replica classes (tp, pp, count) it can host."""
    out: dict[str, list[ReplicaClass]] = {}
    for g in cluster.node_groups:
        opts: list[ReplicaClass] = []
        for tp in _tp_options(space, g.domain_size, cp):
            for pp in sorted(set(space.pp)):
                most = g.num_gpus // (tp * pp * cp)
                if min_fraction > 0 and most * tp * pp * cp != g.num_gpus and not _pow2(pp):
                    # Power-of-two degrees may leave a remainder of the group idle; the
                    # others (3, 5, 6, 7) only where they use it all: otherwise every group
                    # gets ~2x the options and the product over groups explodes.
                    continue
                counts = {most} if min_fraction > 0 else {c for c in _halvings(most)}
                for c in sorted(counts):
                    if c >= 1:
                        ranks = tuple(Slot(group=g.name, tp=tp) for _ in range(pp))
                        opts.append(ReplicaClass(count=c, ranks=ranks))
        out[g.name] = opts
    return out


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


def _halvings(n: int) -> set[int]:
    out = {n}
    while n > 1:
        n //= 2
        out.add(n)
    return out


def split_structures(
    cluster: ClusterSpec, space: SearchSpace, cp: int, min_fraction: float
) -> Iterator[Structure]:
    """One class of single-type replicas per used group (a group may be left out)."""
    opts = group_options(cluster, space, cp, min_fraction)
    names = [g.name for g in cluster.node_groups]
    single = len(names) == 1 and "uniform" in space.families
    choices = [[None, *opts[n]] for n in names]
    total = cluster.num_gpus
    for combo in itertools.product(*choices):
        classes = tuple(c for c in combo if c is not None)
        if not classes:
            continue
        s = Structure(family="split", classes=classes)
        if single and sum(s.gpus(cp).values()) == total:
            continue  # the same plan as a uniform one on a one-group cluster
        if space.dp and s.replicas not in space.dp:
            continue
        if sum(s.gpus(cp).values()) < min_fraction * total:
            continue
        yield s


def enumerate_structures(
    cluster: ClusterSpec, space: SearchSpace, cp: int, min_fraction: float,
    global_batch: int = 0, skipped: list[int] | None = None,
) -> Iterator[Structure]:
    """All structures of the families the space allows, each in both layouts, fixed order."""
    gens: list[Iterator[Structure]] = []
    if "uniform" in space.families:
        gens.append(uniform_structures(cluster, space, cp, min_fraction, global_batch))
    if len(cluster.node_groups) > 1:
        gens.append(mixed_structures(cluster, space, cp, skipped))
    if "split" in space.families:
        gens.append(split_structures(cluster, space, cp, min_fraction))
    for gen in gens:
        for s in gen:
            yield from with_layouts(s, space.layouts)
