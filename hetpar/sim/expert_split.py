"""An uneven expert split over the EP group (``Plan.experts_per_rank``): experts per EP rank.

Pricing assumes a uniform router (each expert receives the same tokens in expectation, the
balanced routing ``formulas.layer_gemms`` assumes; Fedus et al. 2021, Switch Transformer
Sec. 2.2, and Lepikhin et al. 2021, GShard Sec. 2.2, train the router towards it). An EP rank
holding ``e`` of the layer's E experts then receives e / E of its group's routed tokens:
its grouped GEMM runs ``e`` experts of the same rows each, its share of the dispatch bytes
is e x ep / E of the mean, and it holds ``e`` experts' weights, gradients and optimizer
states. The published router imbalance (``moe.rank_load``) multiplies on top of it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetpar import formulas
from hetpar.errors import ConfigError
from hetpar.placement.mesh import Mesh
from hetpar.sim import moe
from hetpar.sim.ep_groups import expert_mesh
from hetpar.sim.layer import layer_time, member_time
from hetpar.sim.network import Topology
from hetpar.sim.profile import DEFAULT, FrameworkProfile
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Split:
    """The experts each EP coordinate holds and what the simulator reads of them."""

    counts: tuple[int, ...]
    """Experts per EP coordinate (position in every EP group)."""
    by_replica: dict[int, int]
    """Per replica, the most experts any of its ranks holds: its ranks run in lockstep with
    their TP / CP peers, so the largest share paces the replica's MoE layers."""

    @property
    def a2a_share(self) -> float:
        """Max / mean tokens one EP rank receives: an all-to-all ends with its busiest
        receiver, so the group's largest share paces every member's dispatch and combine."""
        return max(self.counts) * len(self.counts) / sum(self.counts)


Cost = tuple[float, float]
"""One EP coordinate's MoE-layer forward seconds: (the rest of the layer, one expert)."""


def by_speed(costs: Sequence[Cost], total: int) -> tuple[int, ...]:
    """``total`` experts over ranks of these costs, each >= 1, minimising the slowest rank's
    layer, rest + experts x one expert's seconds: one at a time to the rank whose layer would
    be shortest with it (the greedy is optimal for this min-max allocation of identical
    items whose costs grow with the count: each step keeps the longest layer as short as any
    allocation of that many items can). Equal costs give the even split where ``total``
    divides."""
    if total < len(costs):
        raise ConfigError(f"plan: experts_per_rank needs >= 1 expert per EP rank; "
                          f"{total} experts < ep = {len(costs)}")
    counts = [1] * len(costs)
    heap = [(rest + 2 * one, i) for i, (rest, one) in enumerate(costs)]
    heapq.heapify(heap)
    for _ in range(total - len(costs)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        rest, one = costs[i]
        heapq.heappush(heap, (rest + (counts[i] + 1) * one, i))
    return tuple(counts)


def counts_of(model: ModelSpec, plan: Plan, costs: Sequence[Cost]) -> tuple[int, ...]:
    """Experts per EP coordinate of ``plan`` (``costs``: per coordinate, ``mesh_costs``'; read
    only for ``by_speed``), ConfigError naming the field when explicit counts do not sum to
    the model's experts."""
    split, ep, total = plan.experts_per_rank, plan.degree("ep"), model.n_experts
    if split == "even":
        return (total // ep,) * ep
    if split == "by_speed":
        return by_speed(costs, total)
    assert isinstance(split, tuple), split
    if sum(split) != total:
        raise ConfigError(f"plan: experts_per_rank {list(split)} sums to {sum(split)}; "
                          f"model {model.name} has n_experts = {total}")
    return split


def expert_seconds(model: ModelSpec, gpu: GPUSpec, precision: str, tokens: int, tp: int,
                   experts: tuple[int, int, float], profile: FrameworkProfile = DEFAULT) -> float:
    """Forward seconds of one routed expert's GEMMs on ``gpu`` at the rows per expert of the
    plan (``tokens`` per GPU, ``experts`` = (ep, etp, load): ``formulas.layer_gemms``), at the
    efficiency ``layer_time`` gives them: a rank's expert time is its count times this (its
    backward runs the same GEMMs twice). Small per-expert GEMMs reach a lower share of a fast
    GPU's peak (H100's efficiency table is below A100's under 1e10 FLOPs), so this, not the
    peak, is what an uneven split must follow."""
    gemms = formulas.layer_gemms(model, tokens, tp, True, uneven=True, experts=experts)
    return sum(member_time(gpu, precision, g, profile) for g in gemms
               if g.name.startswith("expert_"))


def mesh_costs(model: ModelSpec, mesh: Mesh, gpu_of: Callable[[str], GPUSpec], precision: str,
               seq: int, profile: FrameworkProfile = DEFAULT) -> list[Cost]:
    """Per EP coordinate of the expert-view ``mesh``, the largest ``Cost`` of the ranks
    holding it: one expert (``expert_seconds``) and the rest of an MoE layer's forward
    (``layer_time`` less its even share of experts: attention, router, shared expert and
    memory-bound work, slower on a slower GPU too), on its GPU (``gpu_of`` a node group's),
    its tp and cp, its replica's micro-batch, ``seq`` tokens per sequence."""
    plan, experts = mesh.plan, moe.experts_of(model, mesh.plan)
    even = model.n_experts // experts[0]
    groups = mesh.groups("ep")
    costs = [(0.0, 0.0)] * len(groups[0])
    for g in groups:
        for c, r in enumerate(g):
            p = mesh.ranks[r]
            rep = plan.replicas[p.replica] if plan.replicas else None
            mb, gpu = rep.micro_batch if rep else plan.micro_batch, gpu_of(p.group)
            one = expert_seconds(model, gpu, precision, mb * (seq // p.cp), p.tp, experts,
                                 profile)
            layer = layer_time(model, gpu, precision, mb, seq, p.tp, p.cp,
                               plan.sequence_parallel, profile, True, experts).fwd
            rest = max(0.0, layer - even * one)
            costs[c] = (max(costs[c][0], rest), max(costs[c][1], one))
    return costs


def split_of(model: ModelSpec, plan: Plan, mesh: Mesh, topo: Topology, precision: str,
             seq: int, profile: FrameworkProfile = DEFAULT) -> Split:
    """The split of ``plan`` on its expert-view ``mesh`` (``ep_groups.expert_mesh``): a
    coordinate's cost is ``mesh_costs``' (the GPUs' efficiency tables, catalog/gpus)."""
    counts = counts_of(model, plan, mesh_costs(model, mesh, topo.gpu, precision, seq, profile))
    by_replica: dict[int, int] = {}
    for g in mesh.groups("ep"):
        for c, r in enumerate(g):
            rep = mesh.ranks[r].replica
            by_replica[rep] = max(by_replica.get(rep, 0), counts[c])
    return Split(counts=counts, by_replica=by_replica)


def plan_split(model: ModelSpec, cluster: ClusterSpec, plan: Plan, topo: Topology,
               precision: str, seq: int, profile: FrameworkProfile = DEFAULT) -> Split | None:
    """``plan``'s split on ``cluster`` (None for the even split: nothing changes)."""
    if plan.experts_per_rank == "even" or plan.degree("ep") == 1:
        return None
    mesh = expert_mesh(model, cluster, plan)
    return split_of(model, plan, mesh, topo, precision, seq, profile)
