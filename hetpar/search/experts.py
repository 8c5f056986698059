"""The planner's expert axes (EP, ETP): the degrees it tries and the rules that prune them early."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from hetpar import catalog, feasibility, formulas
from hetpar.feasibility import Verdict
from hetpar.search.candidates import Knobs
from hetpar.search.space import SearchSpace
from hetpar.search.structures import Structure
from hetpar.sim.memory import state_bytes_per_param
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec


def _ep_degrees(model: ModelSpec, space: SearchSpace) -> tuple[int, ...]:
    # Every divisor of the expert count (the expert_split predicate's first condition); which
    # of them the mesh allows depends on the structure (``structure_verdict``).
    n = model.n_experts
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _etp_degrees(model: ModelSpec, space: SearchSpace) -> tuple[int, ...]:
    # 1 (experts whole on a rank) or the stage's tp (expert_tp predicate), so 1 and every tp
    # of the space that divides the expert width; ``structure_verdict`` keeps the matching one.
    return tuple(sorted({1} | {t for t in space.tp if t > 1 and model.expert_ffn % t == 0}))


MOE_DEGREES: dict[str, Callable[[ModelSpec, SearchSpace], tuple[int, ...]]] = {
    "ep": _ep_degrees,
    "etp": _etp_degrees,
}
"""Per ``plan``-scope axis, the degrees searched for a mixture-of-experts model when the
space names none (``SearchSpace.axes``); a dense model keeps the row's ``searched`` (1), so
dense searches generate exactly the candidates they did before these axes existed."""


def axis_combos(space: SearchSpace, model: ModelSpec | None) -> list[tuple[tuple[str, int], ...]]:
    """Every combination of ``plan``-scope axis degrees to search for ``model`` (``Knobs.axes``
    values, ``knob_sets``): the space's, widened by ``MOE_DEGREES`` for an MoE model. etp > 1
    only with ep > 1: at ep = 1 the experts split over tp as the dense MLP whatever etp says
    (``sim.moe.experts_of``), so those would repeat the etp = 1 plan."""
    named = space.axis_degrees()
    if model is not None and model.n_experts > 1:
        named = [(n, list(MOE_DEGREES[n](model, space)))
                 if n in MOE_DEGREES and n not in space.axes else (n, d) for n, d in named]
    out = []
    for degrees in itertools.product(*(d for _, d in named)):
        combo = tuple(zip((n for n, _ in named), degrees, strict=True))
        by = dict(combo)
        if by.get("etp", 1) > 1 and by.get("ep", 1) == 1:
            continue
        out.append(combo)
    return out


def structure_verdict(s: Structure, k: Knobs, model: ModelSpec) -> Verdict | None:
    """The first failing plan-scope axis predicate of ``k`` on ``s`` (``feasibility.
    axis_verdicts``: ep divides the experts and dp x cp (x tp when etp = 1); etp is 1 or the
    tp), checked once per bound group, before the cost model is asked anything. A structure
    whose stages differ in tp takes etp = 1 only (the expert view needs one tp)."""
    if not k.axes or all(d == 1 for _, d in k.axes):
        return None
    tps = sorted({sl.tp for c in s.classes for sl in c.ranks})
    etp = dict(k.axes).get("etp", 1)
    if etp != 1 and len(tps) > 1:
        return Verdict(name="expert_tp", ok=False,
                       reason=f"etp={etp} must be 1 or the tp degree; tp is "
                              f"{'/'.join(map(str, tps))}")
    pp = max(c.pp for c in s.classes)
    for tp in tps:
        degrees = {"tp": tp, "cp": k.cp, "dp": s.replicas, "pp": pp, **dict(k.axes)}
        for v in feasibility.axis_verdicts(model, degrees):
            if not v.ok:
                return v
    return None


def expert_memory(s: Structure, k: Knobs, model: ModelSpec, cluster: ClusterSpec,
                  precision: str, optimizer: str) -> Verdict | None:
    """Whether the routed experts' states alone overflow a replica's GPUs (a lower bound on
    memory: no dense weights, activations or workspace counted).

    A replica's pipeline ranks hold every MoE layer once, each GPU 1 / (ep x etp) of its
    experts (etp: tp at ep = 1, Megatron-Core's default; ``sim.moe.expert_params_per_gpu``);
    ZeRO shards their gradients and optimizer states (and weights at stage 3) over at most
    dp x cp x tp / (ep x etp) expert-data-parallel peers (``placement.experts``), whatever
    the ZeRO scope, so the bytes per pipeline column are at least that share, to be held by
    the sum of the column's GPU memories (``sim.memory.rank_memory``'s terms).

    The share is the even split's: ``Knobs`` state no ``experts_per_rank``, so every
    candidate this rule sees splits the experts evenly, and for those it is exact. Uneven
    splits (``by_speed``) are tried only by ``expert_speed.try_expert_splits``, on ranked
    plans, i.e. even plans that fit, so a candidate pruned here (the simulator would find
    its even plan out of memory: tests/test_search_experts.py) is one that pass would never
    have reached. Were a stated uneven split checked here, the busiest EP rank's count would
    not be a safe bound per class (a class may hold only lighter ranks; which class holds
    which EP rank is the placement's); the least count is."""
    d = dict(k.axes)
    ep = d.get("ep", 1)
    if model.n_experts == 1:
        return None
    routed = model.n_experts * formulas.expert_params(model) * formulas.moe_layers_in(
        model, 0, model.n_layers)
    wb, gb, ob = state_bytes_per_param(precision, optimizer)
    for c in s.classes:
        tp = max(sl.tp for sl in c.ranks)  # the largest split: the least memory
        split = ep * (tp if ep == 1 else d.get("etp", 1))
        edp = max(1, s.replicas * k.cp * tp // split)
        per = (wb / (edp if k.zero >= 3 else 1) + gb / (edp if k.zero >= 2 else 1)
               + ob / (edp if k.zero >= 1 else 1))
        need = routed / split * per
        have = sum(catalog.gpu_spec(cluster.group(sl.group).gpu).memory_bytes for sl in c.ranks)
        if need > have:
            return Verdict(name="expert_memory", ok=False, kind="memory",
                           reason=f"the routed experts' states alone need {need / 2**30:.0f} "
                                  f"GiB per pipeline column of {c.pp} GPUs > "
                                  f"{have / 2**30:.0f} GiB (ep={ep}, zero={k.zero})")
    return None


def fitting(s: Structure, variants: Sequence[Knobs], model: ModelSpec, cluster: ClusterSpec,
            precision: str, optimizer: str) -> tuple[list[Knobs], Verdict | None]:
    """The variants (same axes, differing in schedule and ZeRO) that pass ``expert_memory``,
    and the verdict of one that did not (None if all pass)."""
    keep: list[Knobs] = []
    why: Verdict | None = None
    for k in variants:
        v = expert_memory(s, k, model, cluster, precision, optimizer)
        if v is None:
            keep.append(k)
        else:
            why = v
    return keep, why
