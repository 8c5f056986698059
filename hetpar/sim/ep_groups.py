"""The shapes of an expert-view axis's groups (``AxisCost.expert_view``), read from the mesh."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hetpar.errors import ConfigError, Infeasible
from hetpar.placement import place
from hetpar.sim import network as net
from hetpar.sim.network import Topology
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

if TYPE_CHECKING:
    from hetpar.placement.mesh import Mesh
    from hetpar.sim.axis_costs import Charged

EDP = "edp"
"""The expert-data-parallel group (``Mesh.with_experts``): the ranks holding the same experts,
over which their gradients are reduced (``Layout.axis_shapes[EDP]`` beside the EP axis's)."""

Shapes = dict[int, dict[int, net.GroupShape]]
"""Per replica, per pipeline rank: the shape of the group holding that replica's rank."""


def expert_mesh(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Mesh:
    """The placed plan's expert view (``Mesh.with_experts(ep, etp)``); Infeasible where ep
    does not divide its groups: explicit replicas hold the same shard only with the same
    layer split, so replicas whose splits differ (the planner's polished plans) form smaller
    groups than dp, which ``feasibility.expert_split`` cannot see from the degrees alone."""
    degrees = dict(axes.plan_degrees(plan))
    mesh = place(model, cluster, plan)
    try:
        return mesh.with_experts(degrees.get("ep", 1), degrees.get("etp", 1))
    except ConfigError as e:
        raise Infeasible("divisibility", str(e)) from None


def check_lockstep(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> None:
    """Infeasible where one EP group joins replicas that run different numbers of
    micro-batches: every member takes part in each micro-batch's dispatch and combine of
    every MoE layer (GShard Sec. 2.2; Megatron-Core's MoEAlltoAllTokenDispatcher and
    torchtitan run one micro-batch count per step), so a replica cannot run fewer. The
    runtime refuses such plans too (``runtime/layout.py::_check_moe``). Replicas that differ
    in batch share may balance a slower GPU only outside an EP group; inside one, the uneven
    expert split does (``Plan.experts_per_rank``)."""
    counts = [r.num_microbatches for r in plan.replicas]
    if plan.degree("ep") == 1 or len(set(counts)) <= 1:
        return
    mesh = expert_mesh(model, cluster, plan)
    for g in mesh.groups("ep"):
        reps = sorted({mesh.ranks[r].replica for r in g})
        seen = sorted({counts[i] for i in reps})
        if len(seen) > 1:
            raise Infeasible("schedule", f"ep group of replicas {reps} would run "
                             f"{'/'.join(map(str, seen))} micro-batches; its members meet in "
                             "every micro-batch's all-to-all: give them one micro-batch count")


def expert_shapes(mesh: Mesh, topo: Topology, name: str,
                  cost: Callable[[net.GroupShape, float], float]) -> tuple[
                      Shapes, dict[int, net.GroupShape]]:
    """Per replica and pipeline rank, the shape of its ``name`` group of the expert view
    ``mesh`` (``expert_mesh``), and per pipeline rank the slowest such group (a 1 MB
    collective ``cost``), which stands for all on the uniform fast path."""
    of_rank: dict[int, net.GroupShape] = {}
    slowest: dict[int, net.GroupShape] = {}
    own: dict[int, net.GroupShape] = {}
    for g in mesh.groups(name):
        shared = topo.shape([(mesh.ranks[r].group, mesh.ranks[r].device) for r in g])
        # Its own recording object: where the group's ranks are a DP or TP group's too,
        # ``Topology.shape`` returns that group's object, and ``hetpar simulate``'s
        # collectives table (``Report.collectives``, one row per communicator and
        # collective) would show the all-to-all under dp and dp's all-reduce under ep.
        # The pricing caches (lines, memo) stay shared: same fields, same prices.
        shape = own.setdefault(id(shared), replace(shared, seen={}))
        p = mesh.ranks[g[0]].pp_rank
        if p not in slowest or cost(shape, 1e6) > cost(slowest[p], 1e6):
            slowest[p] = shape
        for r in g:
            of_rank[r] = shape
    per: Shapes = {}
    for i, stages in enumerate(mesh.stage_ranks):
        per[i] = {}
        for ranks in stages:  # a stage's first rank (tp 0, cp 0) stands for its group
            per[i].setdefault(mesh.ranks[ranks[0]].pp_rank, of_rank[ranks[0]])
    return per, slowest


def uniform_experts(model: ModelSpec, cluster: ClusterSpec, plan: Plan, topo: Topology,
                    costed: Sequence[tuple[Charged, int]]) -> dict[str, dict[int, net.GroupShape]]:
    """The uniform fast path's expert-view groups: per expert-view axis and ``EDP`` (the
    expert gradients' all-reduce group, ``structure._dp_sync``), per pipeline rank, the
    slowest group, which stands for all."""
    # The groups depend only on where the plan's devices sit: the mesh is cached by that (the
    # planner simulates one placement with many micro-batch, recompute, ZeRO and schedule
    # choices, and placing a 1,024-GPU mesh twice per call was most of its time on MoE
    # models). The shapes are ``topo``'s: a network model or forced collectives
    # (``topo.applied``) price them otherwise, so they are cached per variant too.
    placed = (cluster, model.n_layers, plan.tp, plan.pp, plan.dp, plan.cp, plan.group,
              plan.order, plan.uneven_tp, plan.axes)
    key = (placed, topo.applied, tuple((row.name, row.cost.op) for row, _ in costed))
    hit = _UNIFORM.get(key)
    if hit is not None:
        return hit
    out: dict[str, dict[int, net.GroupShape]] = {}
    for row, _ in costed:
        if row.cost.expert_view:
            mesh = _MESHES.get(placed)
            if mesh is None:
                if len(_MESHES) >= 64:
                    _MESHES.clear()
                mesh = _MESHES[placed] = expert_mesh(model, cluster, plan)
            cost = net.collective(row.cost.op)
            out[row.name] = expert_shapes(mesh, topo, row.name, cost)[1]
            out[EDP] = expert_shapes(mesh, topo, EDP, net.all_reduce)[1]
    if len(_UNIFORM) > 4096:
        _UNIFORM.clear()
    _UNIFORM[key] = out
    return out


_UNIFORM: dict[tuple[object, ...], dict[str, dict[int, net.GroupShape]]] = {}
_MESHES: dict[tuple[object, ...], Mesh] = {}
"""The uniform plans' expert views by placement, whatever the network variant (at most 64)."""
