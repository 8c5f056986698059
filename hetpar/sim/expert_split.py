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
from hetpar.sim.layer import member_time
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


def by_speed(speeds: Sequence[float], total: int) -> tuple[int, ...]:
    """``total`` experts over ranks of these speeds, each >= 1, minimising the slowest
    rank's experts / speed: one at a time to the rank whose time would grow least (the
    greedy is optimal for this min-max allocation of identical items: each step keeps the
    largest e / speed as small as any allocation of that many items can). Equal speeds give
    the even split wherever ``total`` divides."""
    if total < len(speeds):
        raise ConfigError(f"plan: experts_per_rank needs >= 1 expert per EP rank; "
                          f"{total} experts < ep = {len(speeds)}")
    counts = [1] * len(speeds)
    heap = [((1 + 1) / s, i) for i, s in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(total - len(speeds)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) / speeds[i], i))
    return tuple(counts)


def counts_of(model: ModelSpec, plan: Plan, speeds: Sequence[float]) -> tuple[int, ...]:
    """Experts per EP coordinate of ``plan`` (``speeds``: per coordinate, its slowest GPU's),
    ConfigError naming the field when explicit counts do not sum to the model's experts."""
    split, ep, total = plan.experts_per_rank, plan.degree("ep"), model.n_experts
    if split == "even":
        return (total // ep,) * ep
    if split == "by_speed":
        return by_speed(speeds, total)
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


def mesh_speeds(model: ModelSpec, mesh: Mesh, gpu_of: Callable[[str], GPUSpec], precision: str,
                seq: int, profile: FrameworkProfile = DEFAULT) -> list[float]:
    """Per EP coordinate of the expert-view ``mesh``, experts per second of the slowest rank
    holding it (``expert_seconds`` at its GPU, ``gpu_of`` a node group's, its tp and its
    tokens: its replica's micro-batch x ``seq`` / cp)."""
    plan, experts = mesh.plan, moe.experts_of(model, mesh.plan)
    groups = mesh.groups("ep")
    speeds = [float("inf")] * len(groups[0])
    for g in groups:
        for c, r in enumerate(g):
            p = mesh.ranks[r]
            rep = plan.replicas[p.replica] if plan.replicas else None
            tokens = (rep.micro_batch if rep else plan.micro_batch) * (seq // p.cp)
            t = expert_seconds(model, gpu_of(p.group), precision, tokens, p.tp, experts, profile)
            speeds[c] = min(speeds[c], 1 / t)
    return speeds


def split_of(model: ModelSpec, plan: Plan, mesh: Mesh, topo: Topology, precision: str,
             seq: int, profile: FrameworkProfile = DEFAULT) -> Split:
    """The split of ``plan`` on its expert-view ``mesh`` (``ep_groups.expert_mesh``): a
    coordinate's speed is ``mesh_speeds``' (the GPUs' efficiency tables, catalog/gpus)."""
    counts = counts_of(model, plan, mesh_speeds(model, mesh, topo.gpu, precision, seq, profile))
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
