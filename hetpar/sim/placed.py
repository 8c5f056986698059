"""Explicit plans' layouts from placements memoized by stage structure; layers and batch per plan.

Where an explicit plan's stages sit, their communicators' shapes, its DP, costed-axis and
hybrid-sharding groups and which replicas are placed alike depend only on each stage's node
group, widths and pinned devices (``specs.expand._assign_devices`` assigns free devices in
stage order, whatever the layers); the expert view's groups also on which replicas cut their
layers alike (``shards``). The planner's candidates that differ only in layer split,
batch share or knobs outside the placement (schedule, ZeRO stage, micro-batch, ...) therefore
place once: ``Skeleton`` keeps that, and ``layouts`` adds each plan's layers and batch. The
result equals ``explicit.explicit_layouts`` on the placed plan (tests/test_sim_placed.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hetpar import schedules
from hetpar.placement import placed_plan
from hetpar.sim import network as net
from hetpar.sim.chunk import Chunk
from hetpar.sim.explicit import (
    AxisShapes,
    Seated,
    device_key,
    expert_axes,
    explicit_groups,
    hybrid,
    seated_chunks,
    with_experts,
)
from hetpar.sim.layout import Costed, Layout
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import check_layers
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

MAX_SKELETONS = 128
"""Placements kept per cluster, least recently used dropped first. The hetero-1024 search of
``bench/search_speed.py`` places 933 stage structures for its 2,048 plans, a structure's next
plan often hundreds of structures later; keeping 64 and then dropping them all reused 138
placements, 128 by recency would reuse 464 (one placement: 0.5-1 MB, 11 ms)."""


@dataclass(frozen=True, kw_only=True)
class Skeleton:
    """One explicit stage structure placed on a cluster (layers as first placed)."""

    topo: net.Topology
    """The cluster as this placement's device usage sees it (``Topology.with_usage``)."""
    chunks: tuple[tuple[Chunk, ...], ...]
    """Per replica, its chunks on their devices."""
    kind: tuple[int, ...]
    """Per replica, the index of its class of alike placed replicas (``layout.device_key``)."""
    pps: tuple[int, ...]
    templates: tuple[Layout, ...]
    """Per class: the layout of its first replica (DP and axis groups), chunks, batch,
    replicas and key to be filled in per plan."""
    experts: tuple[AxisShapes, ...] = ()
    """Per replica, its expert-view groups (``explicit.expert_axes``; empty without EP)."""
    scoped: dict[str, tuple[Layout, ...]] = field(default_factory=dict)
    """``templates`` with hybrid sharding's groups (zero_scope 'group'), once asked for."""

    def templates_for(self, scope: str) -> tuple[Layout, ...]:
        """The class templates under ``Plan.zero_scope`` = ``scope``."""
        if scope == "all":
            return self.templates
        if scope not in self.scoped:
            self.scoped[scope] = tuple(hybrid(t, self.chunks, self.pps, self.topo)
                                       for t in self.templates)
        return self.scoped[scope]


def structure(plan: Plan, costed: Costed) -> tuple[object, ...]:
    """Everything of an explicit plan that its placement and groups read: not batch,
    micro-batch or ZeRO scope (``Skeleton.templates_for``), nor layers but for which replicas
    cut them alike where an axis reads the expert view (``shards``)."""
    key = (plan.vpp, schedules.shape_of(plan.schedule), costed,
           tuple(tuple((s.group, s.tp, s.cp, s.devices) for s in r.stages)
                 for r in plan.replicas))
    if any(row.cost.expert_view for row, _ in costed):  # expert_axes' mesh reads both
        return (*key, axes.plan_degrees(plan), shards(plan))
    return key


def shards(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Per replica, per stage: the index of its layer range among the plan's distinct ones,
    first seen first. The mesh's groups across replicas (dp, and EP and EDP carved from it)
    join the ranks holding the same layers (``Mesh.key``: equal ranges, not equal counts), so
    which ranges are equal is all of the layers they read: a renaming keeps it, and replicas
    split apart (the planner's polished plans) get their own groups or their own refusal."""
    seen: dict[tuple[int, int], int] = {}
    return tuple(tuple(seen.setdefault(s.layers, len(seen)) for s in r.stages)
                 for r in plan.replicas)


def layouts(model: ModelSpec, cluster: ClusterSpec, plan: Plan, costed: Costed,
            base: net.Topology) -> tuple[list[Layout], net.Topology]:
    """``layout.layouts`` of an explicit plan on ``base`` (the cluster's topology, or its
    variant under forced collectives or an alternative network model: each keeps its own
    memo), placing its stage structure once per topology."""
    key = structure(plan, costed)
    sk = base.placed.pop(key, None)  # re-inserted below: the dict's order is its recency
    if isinstance(sk, Skeleton):
        check_layers(plan, model)  # the only checks of expand that read the layers
    else:
        sk = _skeleton(model, cluster, plan, base, costed, key)
        while len(base.placed) >= MAX_SKELETONS:
            del base.placed[next(iter(base.placed))]
    base.placed[key] = sk
    templates = sk.templates_for(plan.zero_scope)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, r in enumerate(plan.replicas):
        k = (sk.kind[i], r.batch, r.micro_batch, tuple(s.layers for s in r.stages))
        groups.setdefault(k, []).append(i)
    out = []
    for gk, idx in groups.items():
        i = idx[0]
        r = plan.replicas[i]
        chunks = tuple(Chunk(layers=s.layers, group=c.group, tp=c.tp, cp=c.cp, devices=c.devices)
                       for s, c in zip(r.stages, sk.chunks[i], strict=True))
        lay = dataclasses.replace(templates[sk.kind[i]], chunks=chunks, batch=r.batch,
                                  micro_batch=r.micro_batch, replicas=tuple(idx), key=gk)
        out.append(with_experts(lay, sk.experts))
    return out, sk.topo


@dataclass(frozen=True, kw_only=True)
class Placed:
    """What an explicit plan's placement gives whatever the cluster's bandwidths."""

    plan: Plan
    """``placement.placed_plan``: Mesh.plan, its ranks not numbered (first plan's layers)."""
    used: list[tuple[str, int]]
    """The devices the stages use (``Topology.with_usage``)."""
    stages: list[list[list[tuple[str, int]]]]
    """Per replica, per stage: its devices."""
    seated: Seated
    """``explicit.seated_chunks`` of ``plan``."""


def _placed(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
            key: tuple[object, ...]) -> Placed:
    """``plan`` placed, memoized across clusters: an explicit plan's devices depend on its
    stage structure and on the node groups' names and sizes only (``placed_plan``,
    ``expand._assign_devices``), so a cluster state that changes bandwidths, or another
    group's GPU, reuses it. The layers are the first plan's: a hit checks this plan's (as
    ``layouts`` does). ``key``: the plan's ``structure``."""
    key = (key, tuple((g.name, g.num_gpus) for g in cluster.node_groups))
    hit = _PLACED.pop(key, None)  # re-inserted below: the dict's order is its recency
    if hit is None:
        while len(_PLACED) >= MAX_PLACED:
            del _PLACED[next(iter(_PLACED))]
        explicit = placed_plan(model, cluster, plan)
        hit = _PLACED[key] = Placed(
            plan=explicit,
            used=[(s.group, i) for r in explicit.replicas for s in r.stages
                  for i in s.devices or ()],
            stages=[[[(s.group, i) for i in s.devices or ()] for s in r.stages]
                    for r in explicit.replicas],
            seated=seated_chunks(explicit))
    else:
        _PLACED[key] = hit
        check_layers(plan, model)
    return hit


MAX_PLACED = 512
"""Placements kept across clusters, least recently used dropped first (the 8B case of
``bench/replay_decision.py --cost sim`` places 223 stage structures in its first 7
decisions, the process then at 173 MB)."""
_PLACED: dict[tuple[object, ...], Placed] = {}


def _skeleton(model: ModelSpec, cluster: ClusterSpec, plan: Plan, base: net.Topology,
              costed: Costed, key: tuple[object, ...]) -> Skeleton:
    """Place ``plan`` (``placement.placed_plan``) and class its replicas by ``device_key``."""
    done = _placed(model, cluster, plan, key)
    topo = base.with_usage(done.used, done.stages)
    all_chunks, pps, own, dp_shapes, reshard = explicit_groups(done.plan, topo, costed,
                                                               done.seated)
    classes: dict[tuple[object, ...], int] = {}
    kind: list[int] = []
    templates: list[Layout] = []
    for i, ch in enumerate(all_chunks):
        dk = device_key(ch, pps[i], topo)
        if costed:
            dk = (*dk, tuple((n, tuple(sorted(s.items()))) for n, s in own[i].items()))
        c = classes.setdefault(dk, len(templates))  # one hash of the key: shapes hash deep
        if c == len(templates):
            pp = pps[i]
            templates.append(Layout(
                chunks=ch, pp=pp, batch=0, micro_batch=0, replicas=(),
                dp_sizes=dict.fromkeys(range(pp), len(all_chunks)),
                dp_shapes={k: dp_shapes[k] for k in range(pp)},
                reshard={k: reshard[k] for k in range(pp)},
                axis_shapes=own[i] if costed else {},
            ))
        kind.append(c)
    return Skeleton(topo=topo, chunks=tuple(all_chunks), kind=tuple(kind), pps=tuple(pps),
                    templates=tuple(templates),
                    experts=tuple(expert_axes(model, cluster, plan, topo, costed)))
