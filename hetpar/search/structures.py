"""Enumeration of plan structures: which GPUs form which pipeline ranks of which replicas."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from hetpar.placement import block_offsets
from hetpar.search.hashonce import HashOnce
from hetpar.search.space import SearchSpace
from hetpar.specs.cluster import ClusterSpec

MAX_PERMUTED_GROUPS = 3
SUBSET_SAVING = 0.95
"""A uniform subset is generated when it needs at most this fraction of the replicas."""
Layout = Literal["dp-inner", "pp-inner"]
"""Keys of ``hetpar.placement.LAYOUTS`` (the device orders they stand for)."""


class Slot(NamedTuple):
    """One pipeline rank: ``tp * cp`` devices of one node group (a tuple: hashed millions
    of times as part of cache keys)."""

    group: str
    tp: int


@dataclass(frozen=True, kw_only=True)
class ReplicaClass(HashOnce):
    """``count`` identical data-parallel replicas with pipeline ranks ``ranks`` (in order)."""

    __hash__ = HashOnce.__hash__

    count: int
    ranks: tuple[Slot, ...]
    layout: Layout = "dp-inner"
    """Device order inside a group (see ``layout_offsets``)."""

    @property
    def pp(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True, kw_only=True)
class Structure(HashOnce):
    """The heterogeneous skeleton of a plan; knobs (micro-batch, schedule...) come on top."""

    __hash__ = HashOnce.__hash__

    family: str
    classes: tuple[ReplicaClass, ...]
    uniform: tuple[int, int, int] | None = None
    """For the ``uniform`` family: (tp, pp, dp) laid over all groups by ``expand``."""
    layout: Layout = "dp-inner"

    @property
    def replicas(self) -> int:
        return sum(c.count for c in self.classes)

    def gpus(self, cp: int) -> dict[str, int]:
        """Devices used per node group."""
        out: dict[str, int] = {}
        for c in self.classes:
            for s in c.ranks:
                out[s.group] = out.get(s.group, 0) + c.count * s.tp * cp
        return out

    def key(self) -> str:
        """A stable, readable identity used to break ties deterministically."""
        parts = [
            f"{c.count}x[" + ",".join(f"{s.group}:tp{s.tp}" for s in c.ranks) + "]"
            for c in self.classes
        ]
        return f"{self.family}:" + "+".join(parts) + ("" if self.layout == "dp-inner" else "|pp-in")


def layout_offsets(classes: Sequence[ReplicaClass], cp: int) -> dict[tuple[int, int, int], int]:
    """First device (inside its group) of rank r of replica i of class ci: a view of the one
    placement (``hetpar.placement.block_offsets``, the ``device_index`` formula of ``expand``).

    ``dp-inner`` (Megatron's tp-cp-dp-pp order): per group, rank blocks in pipeline order,
    the replicas side by side inside a block -- a stage's data-parallel peers are
    neighbours, pipeline hops take the longer links. ``pp-inner`` (tp-cp-pp-dp): each
    replica's ranks side by side -- pipeline hops stay close, gradient sync goes further.
    Which traffic is heavier depends on the model, batch and network, so both are searched.
    """
    return block_offsets([(c.count, [(slot.group, slot.tp * cp) for slot in c.ranks], c.layout)
                          for c in classes])


def with_layouts(s: Structure, layouts: Sequence[str]) -> Iterator[Structure]:
    """``s`` in each layout of ``layouts`` where they differ (pp > 1, replicas > 1)."""
    if "dp-inner" in layouts:
        yield s
    differs = any(c.pp > 1 and c.count > 1 for c in s.classes) or (
        s.uniform is not None and s.uniform[1] > 1 and s.uniform[2] > 1
    )
    if "dp-inner" not in layouts and not differs:
        yield s
    elif "pp-inner" in layouts and differs:
        classes = tuple(replace(c, layout="pp-inner") for c in s.classes)
        yield replace(s, classes=classes, layout="pp-inner")


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
