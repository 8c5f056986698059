"""Where a plan's chunks sit: replica layouts, their DP groups, and which replicas are identical."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from hetpar import schedules
from hetpar.errors import Infeasible
from hetpar.placement import Symmetric, placed_plan, symmetric
from hetpar.sim import axis_costs
from hetpar.sim import network as net
from hetpar.sim.chunk import Chunk
from hetpar.sim.ep_groups import uniform_experts
from hetpar.sim.layer import gemm_precision
from hetpar.sim.network import Device, Topology
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.collectives import NetworkModel, applied
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import min_layers, padded_split


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One replica structure and the replicas (indices) that share it."""

    chunks: tuple[Chunk, ...]
    pp: int
    batch: int
    micro_batch: int
    replicas: tuple[int, ...]
    dp_sizes: dict[int, int] = field(default_factory=dict)
    dp_shapes: dict[int, net.GroupShape] = field(default_factory=dict)
    reshard: dict[int, bool] = field(default_factory=dict)
    cross: dict[int, tuple[net.GroupShape, int]] = field(default_factory=dict)
    """zero_scope = 'group': per rank, the shape joining one rank of each node group's ZeRO
    group and the smallest such group's size (its shards are the largest to all-reduce)."""
    key: tuple[object, ...] = ()
    notes: tuple[str, ...] = ()
    axis_shapes: dict[str, dict[int, net.GroupShape]] = field(default_factory=dict)
    """Per costed ``plan``-scope axis (``sim.axis_costs.costed``), per pipeline rank: the shape of
    this layout's group of that axis (``AxisCost``: ``degree`` data-parallel peers)."""

    @property
    def width(self) -> int:
        """GPUs of one replica."""
        return sum(c.tp * c.cp for c in self.chunks[: self.pp])

    @property
    def num_gpus(self) -> int:
        return self.width * len(self.replicas)

    def peak_flops(self, topo: Topology, precision: str) -> float:
        """Total dense peak of all GPUs of the replicas sharing this layout."""
        total = 0.0
        for c in self.chunks[: self.pp]:
            gpu = topo.gpu(c.group)
            total += c.tp * c.cp * gpu.peak_flops(gemm_precision(gpu, precision))
        return total * len(self.replicas)


def layouts(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
            network: NetworkModel | None = None, *,
            memo: bool = True) -> tuple[list[Layout], Topology]:
    """The distinct replica structures of ``plan`` on ``cluster`` (one per symmetry class),
    its collectives priced as the plan forces them over ``network`` (None: nominal).

    An explicit plan's placement is memoized by its stage structure (``sim/placed.py``);
    ``memo=False`` places it afresh (the reference the memo is tested against).
    """
    topo = net.topology(cluster).variant(applied(plan.collectives, network))
    costed = axis_costs.costed(plan)  # read before expand: an explicit form keeps what plan names
    # shared NICs: usage decides (see with_usage); hybrid sharding: per-type groups
    if plan.uniform and not topo.shares_nics and plan.zero_scope == "all":
        fast = _uniform(model, cluster, plan, topo)
        if fast is not None:
            return [_uniform_axes(fast, model, plan, costed, topo, cluster)], topo
    if memo and not plan.uniform:
        from hetpar.sim import placed  # placed builds on this module

        return placed.layouts(model, cluster, plan, costed, topo)
    from hetpar.sim.explicit import expert_axes, explicit_layouts  # they build on this module

    explicit = placed_plan(model, cluster, plan)  # the mesh's placed plan (Mesh.plan)
    topo = with_usage(topo, explicit)
    experts = expert_axes(model, cluster, plan, topo, costed)
    return explicit_layouts(explicit, topo, costed, experts), topo


def with_usage(topo: Topology, explicit: Plan) -> Topology:
    """``topo`` as the placed plan's devices and pipelines use it (shared NICs)."""
    used = [(s.group, i) for r in explicit.replicas for s in r.stages for i in s.devices or ()]
    stages = [[[(s.group, i) for i in s.devices or ()] for s in r.stages]
              for r in explicit.replicas]
    return topo.with_usage(used, stages)


Costed = tuple[tuple[axis_costs.Charged, int], ...]
"""``sim.axis_costs.costed(plan)``: the plan-scope axes the simulator charges, with degrees."""


def axis_members(costed: Costed, dp: int) -> Iterator[tuple[str, int]]:
    """(name, degree) of every costed axis; Infeasible if its degree does not divide dp."""
    for row, d in costed:
        if row.cost.expert_view:  # its groups are the mesh's expert view (ep_groups.py)
            continue
        if dp % d:
            raise Infeasible("divisibility", f"{row.name}={d} does not divide dp={dp}: its "
                             "groups are data-parallel peers (AxisCost)")
        yield row.name, d


def _uniform_axes(lay: Layout, model: ModelSpec, plan: Plan, costed: Costed, topo: Topology,
                  cluster: ClusterSpec) -> Layout:
    """The fast path's layout with each costed axis's group: of the ``dp / degree`` groups of
    consecutive replicas, the slowest (1 MB collective) stands for all, as replica 0 does."""
    if not costed:
        return lay
    sym = symmetric(plan, cluster)
    assert sym is not None
    shapes: dict[str, dict[int, net.GroupShape]] = {}
    rows = {row.name: row for row, _ in costed}
    for name, d in axis_members(costed, plan.dp):
        cost = net.collective(rows[name].cost.op)
        runs = {p: sym.members("dp", pp=p) for p in range(plan.pp)}  # the mesh's dp groups
        shapes[name] = {
            p: max((topo.shape([(sym.group, i) for i in runs[p][s:s + d]])
                    for s in range(0, plan.dp, d)), key=lambda sh: cost(sh, 1e6))
            for p in range(plan.pp)
        }
    shapes.update(uniform_experts(model, cluster, plan, topo, costed))
    return dataclasses.replace(lay, axis_shapes=shapes)


def _levels(g: NodeGroup, cluster: ClusterSpec) -> list[int]:
    sizes = [g.domain_size, g.gpus_per_node]
    sizes += [t.size_gpus for t in cluster.tiers if t.size_gpus]
    return sizes


def _aligned(width: int, sizes: Sequence[int]) -> bool:
    return all(s % width == 0 or width % s == 0 for s in sizes)


def _uniform(model: ModelSpec, cluster: ClusterSpec, plan: Plan, topo: Topology) -> Layout | None:
    """Fast path for a uniform plan on one node group in Megatron's default rank order.

    When every network level is a multiple or a divisor of the tp*cp block (and the group
    starts on a level boundary), every replica's TP/CP groups and every DP group classify
    alike, so replica 0 stands for all; p2p paths are taken at the worst replica when the
    pipeline stride is not aligned. Anything else goes through ``expand``. The devices are
    the placement's symmetric view (``hetpar.placement.symmetric``); what this derives from
    it on the cluster's network is memoized in that view, keyed by value.
    """
    sym = symmetric(plan, cluster)
    if plan.order != "tp-cp-dp-pp" or sym is None:
        return None
    g = cluster.group(sym.group)
    off = sym.offset
    sizes = _levels(g, cluster)
    w = plan.tp * plan.cp
    if any(off % s for s in sizes[2:]) or not _aligned(w, sizes):
        return None
    if model.n_layers < min_layers(plan.pp, plan.vpp):
        raise Infeasible(
            "divisibility", f"{model.n_layers} layers < pp*vpp = {plan.pp}*{plan.vpp} chunks"
        )
    key = ("sim.layout", cluster, plan.vpp, model.n_layers, topo.applied)
    hit = cast("Placed | None", sym.memo.get(key))
    if hit is None:
        if len(sym.memo) > 16:
            sym.memo.clear()
        hit = _place_uniform(model, plan, topo, sym, sizes)
        sym.memo[key] = hit
    chunks, shapes = hit
    return Layout(
        chunks=chunks, pp=plan.pp, batch=plan.batch // plan.dp, micro_batch=plan.micro_batch,
        replicas=tuple(range(plan.dp)), dp_sizes=dict.fromkeys(range(plan.pp), plan.dp),
        dp_shapes=shapes, key=("uniform",),
        notes=("uniform plan: replicas identical by symmetry, simulated once",),
    )


Placed = tuple[tuple[Chunk, ...], dict[int, net.GroupShape]]
"""Replica 0's chunks and each pipeline rank's DP group shape (the fast path's memo)."""


def _place_uniform(
    model: ModelSpec, plan: Plan, topo: Topology, sym: Symmetric, sizes: Sequence[int]
) -> Placed:
    """Replica 0's chunks on their devices and each pipeline rank's DP group shape."""
    block = plan.tp * plan.cp * plan.dp
    chunks_n = plan.pp * plan.vpp

    def stage(d: int, p: int) -> tuple[Device, ...]:
        """Replica d's pipeline rank p: the mesh's cp x tp group (cp-major, tp inner)."""
        return tuple((sym.group, i) for i in sym.members("cp_tp", dp=d, pp=p))

    where = schedules.placement(plan.schedule, plan.pp, plan.vpp)
    chunks = tuple(
        Chunk(layers=rng, group=sym.group, tp=plan.tp, cp=plan.cp, devices=stage(0, where[j]))
        for j, rng in enumerate(padded_split(model.n_layers, chunks_n))
    )
    if not _aligned(block, sizes) and plan.pp > 1:
        chunks = _worst_p2p(chunks, plan, topo, stage)
    # each pipeline rank's dp group (through tp rank 0, cp rank 0) stands for all of them
    shapes = {p: topo.shape([(sym.group, i) for i in sym.members("dp", pp=p)])
              for p in range(plan.pp)}
    return chunks, shapes


StageOf = Callable[[int, int], tuple[Device, ...]]


def _worst_p2p(
    chunks: tuple[Chunk, ...], plan: Plan, topo: Topology, stage: StageOf
) -> tuple[Chunk, ...]:
    """Re-seat replica 0's chunks on the replica whose pipeline hops are slowest."""
    def hops(d: int) -> float:
        # seconds to pass a 1 MB message down the whole pipeline of replica d
        total = 0.0
        for p in range(plan.pp - 1):
            total += net.p2p(topo.p2p_path(stage(d, p)[0], stage(d, p + 1)[0]), 1e6)
        return total

    worst = max(range(plan.dp), key=hops)
    where = schedules.placement(plan.schedule, plan.pp, plan.vpp)
    return tuple(
        Chunk(layers=c.layers, group=c.group, tp=c.tp, cp=c.cp, devices=stage(worst, where[j]))
        for j, c in enumerate(chunks)
    )
