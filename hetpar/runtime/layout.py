"""Rank layout of a plan: which rank runs which replica, pipeline rank, TP index and layers.

Pure Python (no torch) so the dry run and the planner side can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetpar import catalog, feasibility, schedules
from hetpar.errors import Infeasible, RuntimeGap
from hetpar.placement import Mesh, place
from hetpar.sim import expert_split
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

# Mesh axis names (torchtitan style); the uniform DeviceMesh is ordered (pp, dp, tp).
MESH_AXES = ("pp", "dp", "tp")


@dataclass(frozen=True, kw_only=True)
class RankRole:
    """What one rank does: replica ``replica``, pipeline rank ``pp_rank``, TP index ``tp_rank``."""

    rank: int
    replica: int
    pp_rank: int
    pp: int
    tp_rank: int
    tp: int
    chunks: tuple[int, ...]
    """Model chunks (stage indices in model order) this rank runs: j with j % pp == pp_rank."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The expanded plan with every stage's devices mapped to ranks 0..world_size-1."""

    plan: Plan
    model: ModelSpec
    mesh: Mesh
    """The one placement (``hetpar.placement.place``): process groups are its groups by name."""
    world_size: int
    stage_ranks: tuple[tuple[tuple[int, ...], ...], ...]
    """``stage_ranks[r][j]``: ranks (TP order) of stage j of replica r."""
    roles: tuple[RankRole, ...]
    nodes: tuple[int, ...] = ()
    """Node of every rank (cluster-wide numbering); empty: all on one node."""
    hierarchical: bool = False
    """Gradient sync inside nodes first, shards across (``hiersync``): the plan's
    ``collectives.dp_sync``, or where it says ``auto`` the cluster's ``collectives``
    (``hierarchical`` or ``best``; the split over parallel paths is not executed)."""
    node_groups: tuple[str, ...] = ()
    """Node group (GPU type) of every rank, from the placement; empty: all in one group. With
    ``plan.zero_scope = "group"`` a ZeRO stage shards over the DP peers of the same node group
    (``hetpar.runtime.hybrid``)."""
    expert_counts: tuple[int, ...] = ()
    """Experts per EP coordinate of an uneven split (``Plan.experts_per_rank``); empty: even."""

    @property
    def replicas(self) -> int:
        return len(self.stage_ranks)

    def stage_layers(self, replica: int, chunk: int) -> tuple[int, int]:
        """Transformer layers [start, end) of ``chunk`` in ``replica``."""
        return self.plan.replicas[replica].stages[chunk].layers

    def num_chunks(self, replica: int) -> int:
        return len(self.stage_ranks[replica])

    def uniform_tp(self) -> bool:
        """True when every replica runs at the same TP degree with the same layer split."""
        first = [s.layers for s in self.plan.replicas[0].stages]
        tps = {s.tp for r in self.plan.replicas for s in r.stages}
        same = all([s.layers for s in r.stages] == first for r in self.plan.replicas)
        return len(tps) == 1 and same

    def is_mesh(self) -> bool:
        """True when the plan is a (pp, dp, tp) grid that one DeviceMesh can describe."""
        pps = {len(r) for r in self.stage_ranks}
        return self.uniform_tp() and len(pps) == 1 and self.plan.vpp == 1

    def mesh_ranks(self) -> list[list[list[int]]]:
        """Ranks as a nested [pp][dp][tp] list (only when ``is_mesh()``)."""
        assert self.is_mesh()
        pp = len(self.stage_ranks[0])
        return [[list(self.stage_ranks[d][p]) for d in range(self.replicas)] for p in range(pp)]

    def experts_of(self, rank: int) -> tuple[int, int] | None:
        """Experts [a, b) of every MoE layer that ``rank`` holds: its share by its coordinate
        in the mesh's ``ep`` group (None for a dense model: all of nothing to split)."""
        if self.model.n_experts == 1:
            return None
        e = self.mesh.coordinate(rank, "ep")
        if self.expert_counts:  # an uneven split: the coordinates before it hold the first
            a = sum(self.expert_counts[:e])
            return (a, a + self.expert_counts[e])
        held = self.model.n_experts // self.mesh.size("ep")
        return (e * held, (e + 1) * held)

    def ep_ranks(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s expert-parallel group (the mesh's ``ep``), in EP order."""
        if self.model.n_experts == 1:
            return (rank,)
        return next(g for g in self.mesh.groups("ep") if rank in g)

    def zero_peers(self, ranks: tuple[int, ...], rank: int) -> tuple[int, ...]:
        """The ranks of DP group ``ranks`` that ``rank``'s ZeRO stage shards over: all of
        them, or with ``zero_scope = "group"`` those on ``rank``'s node group (sorted)."""
        if self.plan.zero_scope != "group" or not self.node_groups:
            return tuple(sorted(ranks))
        mine = self.node_groups[rank]
        return tuple(sorted(r for r in ranks if self.node_groups[r] == mine))


def local_cluster(num_devices: int, gpu: str = "cpu") -> ClusterSpec:
    """A one-node cluster of ``num_devices`` local devices, for runs without a cluster file."""
    group = NodeGroup(name="local", gpu=gpu, num_nodes=1, gpus_per_node=max(num_devices, 1))
    return ClusterSpec(name="local", node_groups=(group,))


def _devices_needed(plan: Plan) -> int:
    if plan.uniform:
        return plan.num_gpus()
    return plan.num_gpus()


def build_layout(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None = None) -> Layout:
    """Expand ``plan`` on ``cluster`` (default: a local one of just enough devices) into ranks.

    A view of ``hetpar.placement.place``: ranks are the used devices in cluster order, so rank
    order matches the device order ``expand`` assigns (``plan.order`` for uniform plans).
    """
    cluster = cluster or local_cluster(_devices_needed(plan))
    # the structural predicates first, in the order simulate asks them (one verdict)
    feasibility.check_plan(model, plan, uneven_tp_ok=plan.uneven_tp)
    pl = place(model, cluster, plan)
    _check_supported(pl.plan, model)
    if model.n_experts > 1:  # the expert view: ep groups and the edp groups of expert grads
        pl = pl.with_experts(pl.plan.degree("ep"), pl.plan.degree("etp"))
        if any(list(g) != sorted(g) for g in pl.groups("ep")):
            # the all-to-all's splits go in communicator order, which is rank order
            raise RuntimeGap("plan: an ep group's replicas are not in rank order (explicit "
                             "devices); allowed: replicas numbered in the order of their ranks")
    roles = tuple(
        RankRole(rank=p.rank, replica=p.replica, pp_rank=p.pp_rank, pp=p.pp, tp_rank=p.tp_rank,
                 tp=p.tp, chunks=p.chunks)
        for p in pl.ranks
    )
    return Layout(plan=pl.plan, model=model, mesh=pl, world_size=pl.world_size,
                  stage_ranks=pl.stage_ranks, roles=roles,
                  nodes=_nodes(cluster, [cluster.group_offset(p.group) + p.device
                                         for p in pl.ranks]),
                  hierarchical=_hierarchical(pl.plan, cluster),
                  node_groups=tuple(p.group for p in pl.ranks),
                  expert_counts=_expert_counts(pl, model, cluster))


def _expert_counts(mesh: Mesh, model: ModelSpec, cluster: ClusterSpec) -> tuple[int, ...]:
    """Experts per EP coordinate of the plan's uneven split (empty: even), as the simulator
    counts them (``sim.expert_split``); one GPU type makes ``by_speed`` the even split."""
    plan = mesh.plan
    if model.n_experts == 1 or plan.degree("ep") == 1 or plan.experts_per_rank == "even":
        return ()
    gpus = {g.name: g.gpu for g in cluster.node_groups}
    if plan.experts_per_rank != "by_speed":  # counts: no speeds asked
        return expert_split.counts_of(model, plan, ())
    if len(set(gpus.values())) == 1:
        return expert_split.by_speed([(0.0, 1.0)] * plan.degree("ep"), model.n_experts)
    costs = expert_split.mesh_costs(model, mesh, lambda g: catalog.gpu_spec(gpus[g]),
                                    plan.precision, model.seq_len)
    return expert_split.counts_of(model, plan, costs)


def _hierarchical(plan: Plan, cluster: ClusterSpec) -> bool:
    """The plan's ``dp_sync`` (``flat``: one NCCL call per bucket), else the cluster's choice,
    as the simulator prices it (``sim/network.py`` ``_shape``)."""
    sync = plan.collectives.dp_sync if plan.collectives else "auto"
    return sync == "hierarchical" or (sync == "auto" and cluster.collectives != "nccl")


def _nodes(cluster: ClusterSpec, devices: list[int]) -> tuple[int, ...]:
    """Cluster-wide node index of each global device (ranks are the devices in order)."""
    starts, first = [], 0
    for g in cluster.node_groups:
        starts.append((cluster.group_offset(g.name), g.gpus_per_node, first))
        first += g.num_nodes
    out = []
    for d in devices:
        off, gpn, base = max(x for x in starts if x[0] <= d)
        out.append(base + (d - off) // gpn)
    return tuple(out)


def _check_supported(plan: Plan, model: ModelSpec) -> None:
    """Reject what the runtime cannot execute, naming the field and the allowed values.

    Feasibility is hetpar.feasibility's, the same predicates simulate and plan apply
    (without nonuniform TP, which the runtime cannot execute); the rest are runtime limits.
    """
    if schedules.shape_of(plan.schedule) == "v":
        # the runtime places chunk j on rank j % pp (the mesh's stage_indices)
        raise RuntimeGap(f"plan: schedule={plan.schedule} places its chunks in a V, which the "
                         "runtime does not run yet; allowed: a looped or one-chunk schedule")
    # the axes this runtime does not execute, from their rows in specs/axes.py
    unexecuted = [a.name for a in axes.of_scope("stage") if not a.runtime]
    for rep in plan.replicas:
        tps = {s.tp for s in rep.stages}
        if len(tps) > 1:
            raise RuntimeGap(
                f"plan: a replica mixes TP degrees {sorted(tps)} across its stages; "
                "the runtime needs one TP degree per replica (replicas may differ)"
            )
        for s in rep.stages:
            for a in unexecuted:
                if getattr(s, a) != 1:
                    raise RuntimeGap(
                        f"plan: {a}={getattr(s, a)} is not supported by the runtime; allowed: 1")
            check_tp(model, s.tp)
    for a, d in axes.plan_degrees(plan):
        if d != 1 and not axes.get(a).runtime:
            raise RuntimeGap(f"plan: {a}={d} is not supported by the runtime; allowed: 1")
    if model.n_experts > 1:
        _check_moe(plan)
    feasibility.check_plan(model, plan, uneven_tp_ok=False)


def _check_moe(plan: Plan) -> None:
    """The runtime's limits for a mixture-of-experts model (runtime/moe.py), each named."""
    tps = sorted({s.tp for r in plan.replicas for s in r.stages} or {plan.tp})
    if tps != [1]:
        # its MoE layers run whole on a rank: no expert TP, no token split over TP ranks
        raise RuntimeGap(f"plan: tp={'/'.join(map(str, tps))} with a mixture-of-experts "
                         "model is not supported by the runtime; allowed: tp=1 (ep, dp, pp)")
    ep = plan.degree("ep")
    if ep > 1 and plan.zero == 3:
        raise RuntimeGap(f"plan: zero=3 (FSDP2) with ep={ep} is not supported by the "
                         "runtime; allowed: zero 0, 1 or 2 with ep > 1")
    shapes = [(tuple(s.layers for s in r.stages), r.num_microbatches) for r in plan.replicas]
    if ep > 1 and len(set(shapes)) > 1:
        # an EP group's ranks meet in every MoE layer's all-to-all: the same layers, in the
        # same number of microbatches (their batch shares may differ)
        shown = "; ".join(f"replica {i}: layers {[list(x) for x in lay]}, {n} microbatches"
                          for i, (lay, n) in enumerate(shapes))
        raise RuntimeGap(f"plan: ep={ep} needs replicas with one layer split and microbatch "
                         f"count; {shown}")


def check_buildable(model: ModelSpec) -> None:
    """RuntimeGap when the runtime's decoder would build a different model than ``model``
    (``feasibility.decoder_gaps``): `hetpar run` and its dry run ask it before the plan."""
    gaps = feasibility.decoder_gaps(model)
    if gaps:
        raise RuntimeGap(
            f"model {model.name!r}: the hetpar runtime's decoder does not build {'; '.join(gaps)}; "
            "it would train a different model ("
            + ("simulate takes it" if model.layer_kinds else "simulate, plan and export take it")
            + ")")


def check_zero3(layout: Layout) -> None:
    """RuntimeGap when a ``zero = 3`` plan is not pure DP: FSDP2 (``runtime/fsdp.py``) wraps
    whole blocks on every rank, so it runs neither TP shards nor pipeline stages. `hetpar run`,
    its dry run and the FSDP2 trainer ask it, so the refusal comes before any rank starts."""
    if layout.plan.zero == 3 and any(len(r) > 1 or any(len(s) > 1 for s in r)
                                     for r in layout.stage_ranks):
        raise RuntimeGap("plan: zero=3 (FSDP2) is supported with tp=1, pp=1; allowed: dp only")


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise Infeasible when ``model`` cannot be split ``tp`` ways (heads, KV heads, MLP), or
    when this runtime's vocabulary-parallel LM head would need padding."""
    feasibility.tp_shards(model, tp).raise_if_failed()
    if not model.tied_embeddings and model.vocab % tp:
        # A runtime limit, not feasibility: Megatron pads the vocabulary and the simulator
        # costs the padded shard; this runtime's head does not pad (yet).
        raise Infeasible(
            "divisibility",
            f"model vocab ({model.vocab}) not divisible by tp ({tp}): the hetpar runtime's "
            "vocabulary-parallel LM head does not pad",
        )
