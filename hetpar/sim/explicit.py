"""Explicit plans' replicas on their devices: chunks, DP, axis, expert and hybrid groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hetpar import schedules
from hetpar.sim import network as net
from hetpar.sim.chunk import Chunk
from hetpar.sim.ep_groups import EDP, expert_mesh, expert_shapes
from hetpar.sim.layout import Costed, Layout, axis_members
from hetpar.sim.network import Topology
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica


def explicit_layouts(plan: Plan, topo: Topology, costed: Costed = (),
                     experts: Sequence[AxisShapes] = ()) -> list[Layout]:
    """Layouts of an expanded plan, replicas grouped by structural key; each layout with the
    ``experts`` groups (``expert_axes``) of its first replica."""
    reps = plan.replicas
    all_chunks, pps, own, dp_shapes, reshard = explicit_groups(plan, topo, costed)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, (r, ch) in enumerate(zip(reps, all_chunks, strict=True)):
        key = (r.batch, r.micro_batch, *device_key(ch, pps[i], topo),
               tuple(c.layers for c in ch))
        if costed:  # a replica's costed-axis groups are its own: part of what it costs
            key = (*key, tuple((n, tuple(sorted(s.items()))) for n, s in own[i].items()))
        groups.setdefault(key, []).append(i)
    out = []
    for key, idx in groups.items():
        i = idx[0]
        pp = pps[i]
        lay = Layout(
            chunks=all_chunks[i], pp=pp, batch=reps[i].batch, micro_batch=reps[i].micro_batch,
            replicas=tuple(idx), dp_sizes=dict.fromkeys(range(pp), len(reps)),
            dp_shapes={k: dp_shapes[k] for k in range(pp)},
            reshard={k: reshard[k] for k in range(pp)}, key=key,
            axis_shapes=own[i] if costed else {},
        )
        if plan.zero_scope == "group":
            lay = hybrid(lay, all_chunks, pps, topo)
        out.append(with_experts(lay, experts))
    return out


AxisShapes = dict[str, dict[int, net.GroupShape]]
"""Per axis, per pipeline rank: the shape of one replica's group of that axis."""


def expert_axes(model: ModelSpec, cluster: ClusterSpec, plan: Plan, topo: Topology,
                costed: Costed) -> list[AxisShapes]:
    """Per replica of the mesh's placed ``plan``, the groups of its expert-view axes and
    ``EDP`` (``ep_groups.expert_shapes``); empty when ``costed`` has no expert-view axis."""
    out: list[AxisShapes] = []
    mesh = None
    for row, _ in costed:
        if not row.cost.expert_view:
            continue
        mesh = mesh or expert_mesh(model, cluster, plan)  # placed once for both groups
        per, _slow = expert_shapes(mesh, topo, row.name, net.collective(row.cost.op))
        edp, _slow = expert_shapes(mesh, topo, EDP, net.all_reduce)
        out = out or [{} for _ in per]
        for i, shapes in enumerate(out):
            shapes[row.name], shapes[EDP] = per[i], edp[i]
    return out


def with_experts(lay: Layout, experts: Sequence[AxisShapes]) -> Layout:
    """``lay`` with the expert-view groups of its first replica (none when ``experts`` is)."""
    if not experts:
        return lay
    return dataclasses.replace(lay, axis_shapes={**lay.axis_shapes, **experts[lay.replicas[0]]})


Groups = tuple[list[tuple[Chunk, ...]], list[int], list[dict[str, dict[int, net.GroupShape]]],
               dict[int, net.GroupShape], dict[int, bool]]
"""Per replica its chunks, pipeline ranks and costed-axis groups; per pipeline rank the DP
group's shape and whether its replicas' TP degrees differ (a reshard)."""


def explicit_groups(plan: Plan, topo: Topology, costed: Costed = (),
                    seated: Seated | None = None) -> Groups:
    """The chunks and groups of an expanded plan's replicas (``Groups``); ``seated``: its
    ``seated_chunks``, when already known (they do not depend on the topology)."""
    all_chunks, pps = seated if seated is not None else seated_chunks(plan)
    max_pp = max(pps)
    dp_shapes: dict[int, net.GroupShape] = {}
    reshard: dict[int, bool] = {}
    for k in range(max_pp):
        members = [ch[min(k, pps[i] - 1)] for i, ch in enumerate(all_chunks)]
        dp_shapes[k] = topo.shape([c.devices[0] for c in members])
        reshard[k] = len({c.tp for c in members}) > 1
    own = _explicit_axes(all_chunks, pps, topo, costed)
    return all_chunks, pps, own, dp_shapes, reshard


Seated = tuple[list[tuple[Chunk, ...]], list[int]]
"""Per replica of an expanded plan: its chunks on their devices, and its pipeline ranks."""


def seated_chunks(plan: Plan) -> Seated:
    """``Seated`` of an expanded plan (``_chunks`` of each replica)."""
    shape = schedules.shape_of(plan.schedule)
    return ([_chunks(r, plan.pp_of(r), shape) for r in plan.replicas],
            [plan.pp_of(r) for r in plan.replicas])


def _explicit_axes(all_chunks: Sequence[Sequence[Chunk]], pps: Sequence[int], topo: Topology,
                   costed: Costed) -> list[dict[str, dict[int, net.GroupShape]]]:
    """Per replica i, per costed axis, per pipeline rank k: the shape of its group, the
    replicas ``i // degree * degree`` onwards (rank k's first TP device of each)."""
    out: list[dict[str, dict[int, net.GroupShape]]] = [{} for _ in all_chunks]
    for name, d in axis_members(costed, len(all_chunks)):
        for i in range(len(all_chunks)):
            start = i // d * d
            peers = range(start, start + d)
            out[i][name] = {k: topo.shape([all_chunks[j][min(k, pps[j] - 1)].devices[0]
                                           for j in peers]) for k in range(pps[i])}
    return out


def hybrid(lay: Layout, all_chunks: Sequence[Sequence[Chunk]], pps: Sequence[int],
            topo: Topology) -> Layout:
    """Hybrid sharding: each rank's ZeRO group is its stage's peers on the same node group;
    one rank per node group then all-reduces its shard across the groups."""
    sizes, shapes, cross = {}, {}, {}
    for k in range(lay.pp):
        members = [ch[min(k, pps[i] - 1)] for i, ch in enumerate(all_chunks)]
        by_group: dict[str, list[Chunk]] = {}
        for c in members:
            by_group.setdefault(c.group, []).append(c)
        own = by_group[lay.chunks[k].group]
        sizes[k], shapes[k] = len(own), topo.shape([c.devices[0] for c in own])
        if len(by_group) > 1:
            cross[k] = (topo.shape([g[0].devices[0] for g in by_group.values()]),
                        min(len(g) for g in by_group.values()))
    return dataclasses.replace(lay, dp_sizes=sizes, dp_shapes=shapes, cross=cross,
                               key=(*lay.key, "group"))


def _chunks(r: Replica, pp: int, shape: schedules.ChunkShape) -> tuple[Chunk, ...]:
    """A replica's chunks on their ranks' devices: ``expand`` seats chunk j on rank j % pp;
    a V-shaped schedule runs it on ``schedules.rank_of(j)`` (specs cannot read schedules)."""
    out = []
    for j, s in enumerate(r.stages):
        at = r.stages[schedules.rank_of(j, pp, shape)]
        assert at.devices is not None, "expand assigns every stage's devices"
        out.append(Chunk(layers=s.layers, group=at.group, tp=s.tp, cp=s.cp,
                         devices=tuple((at.group, i) for i in at.devices)))
    return tuple(out)


def device_key(chunks: Sequence[Chunk], pp: int, topo: Topology) -> tuple[object, ...]:
    """Two replicas with equal keys, layers and batch cost the same: equally placed chunks
    (shapes and paths as ``Topology.token``s: equal exactly when the values are)."""
    parts: list[object] = [pp]
    token = topo.token
    for j, c in enumerate(chunks):
        hop = -1
        if j + 1 < len(chunks):
            hop = token(topo.p2p_path(c.devices[0], chunks[j + 1].devices[0]))
        parts.append((c.group, c.tp, c.cp, token(topo.shape(c.devices[: c.tp])),
                      token(topo.shape(c.devices[:: c.tp])), hop))
    return tuple(parts)
