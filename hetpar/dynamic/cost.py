"""Throughput of a plan on a cluster state: the interface, and a fast approximation of it.

``AnalyticThroughput`` is an explicitly fast approximation (hetpar.sim is the cost engine,
``SimThroughput`` uses it): per stage, matmul FLOPs at the GPU's measured efficiency plus
Megatron TP all-reduces, a 1F1B pipeline over heterogeneous stages, and a ring all-reduce
of gradients across replicas without overlap, each priced with the simulator's public cost
terms (``hetpar.sim.terms``: its ring, its bytes per element and per parameter). It exists
so that replay and its tests run fast, and it sees every change a trace makes (bandwidths,
paths, slowed GPUs, missing nodes); tests/test_analytic_vs_sim.py keeps it near the
simulator on every bundled cluster.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

from hetpar import feasibility, formulas
from hetpar.catalog import gpu_spec
from hetpar.dynamic.paths import Network
from hetpar.dynamic.state import ClusterState
from hetpar.errors import Infeasible
from hetpar.sim import terms
from hetpar.sim.profile import resolve
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import expand
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage


class ThroughputModel(Protocol):
    """Tokens per second of ``plan`` on ``state``; 0.0 when the plan cannot run there."""

    def tokens_per_s(self, plan: Plan, state: ClusterState) -> float: ...


@lru_cache(maxsize=4096)
def _stage_flops_per_token(model: ModelSpec, seq: int, a: int, b: int) -> float:
    """Forward FLOPs per token of layers [a, b)."""
    return sum(formulas.layer_forward_flops_per_token(model, seq, i) for i in range(a, b))


@lru_cache(maxsize=4096)
def _stage_params(model: ModelSpec, a: int, b: int, first: bool, last: bool) -> float:
    p = float(formulas.layers_params(model, a, b))
    if first:
        p += formulas.embedding_params(model)
    if last:
        p += formulas.output_params(model)
    return p


class AnalyticThroughput:
    """The analytic model above, for one model and job."""

    def __init__(self, model: ModelSpec, job: Job) -> None:
        self.model, self.job = model, job
        self.seq = job.seq_len or model.seq_len
        # memory outside the model's tensors: the job's framework's data, as sim/memory.py
        # reads it (catalog/frameworks/*.toml cite reserved_memory_gib and fragmentation)
        self.profile = resolve(job.framework or None)
        # Pipeline times per cluster state and replica signature, shared across plans: the
        # planner scores hundreds of plans that differ in one group's shape.
        self._pipes: dict[ClusterSpec, dict[tuple[object, ...], float]] = {}
        self._sigs: dict[int, tuple[Replica, ClusterSpec, tuple[object, ...], float]] = {}

    def tokens_per_s(self, plan: Plan, state: ClusterState) -> float:
        """Tokens per second, or 0.0 if the plan does not fit the state (devices, memory, links)."""
        try:
            return plan.batch * self.seq / self.iteration_s(plan, state)
        except Infeasible:
            return 0.0

    def iteration_s(self, plan: Plan, state: ClusterState) -> float:
        """Seconds per iteration; Infeasible if the plan does not fit ``state``."""
        if state.cluster is None:
            raise Infeasible("devices", "no node is left")
        # the verdict simulate gives the same plan (heads over every stage's TP, layers per
        # stage, schedule, CP split): a plan simulate refuses has no throughput here either
        feasibility.check_costed(self.model, plan, seq_len=self.seq)
        needs_expand = plan.uniform or any(
            s.devices is None for r in plan.replicas for s in r.stages)
        p = expand(plan, self.model, state.cluster) if needs_expand else plan
        net = Network(state.cluster)
        pipe = self._pipes.get(state.cluster)
        if pipe is None:  # equal states (a flapping link) share their cache
            if len(self._pipes) > 64:
                self._pipes.clear()
            pipe = self._pipes[state.cluster] = {}
        knobs = (p.precision, p.recompute, p.sequence_parallel, p.zero, p.vpp,
                 len(p.replicas) if p.zero else 1)
        worst, grad_bytes = 0.0, 0.0
        per_group: dict[str, int] = {}
        for r in p.replicas:
            sig = (self._signature(r, net), r.batch, r.micro_batch, knobs)
            if sig not in pipe:
                pipe[sig] = self._pipeline_s(p, r, net)
            worst = max(worst, pipe[sig])
            grad_bytes = max(grad_bytes, self._sigs[id(r)][3] * terms.element_bytes(p.precision))
            per_group[r.stages[0].group] = per_group.get(r.stages[0].group, 0) + 1
        return worst + self._dp_s(len(p.replicas), per_group, grad_bytes, net)

    def _signature(self, r: Replica, net: Network) -> tuple[object, ...]:
        """What a replica's time depends on: stage shapes and where they sit relative to nodes.

        Raises Infeasible if a stage's devices are not in the cluster any more.
        """
        hit = self._sigs.get(id(r))
        if hit is not None and hit[0] is r and hit[1] is net.cluster:
            return hit[2]  # a planner re-uses replica objects across the plans it scores
        out = []
        for s in r.stages:
            g = net.groups.get(s.group)
            devs = s.devices or (0,)
            if g is None or max(devs) >= g.num_gpus:
                raise Infeasible("devices", f"devices of node group {s.group!r} are gone")
            out.append((s.group, s.tp, s.cp, s.layers, devs[0] % g.gpus_per_node,
                        devs[0] // g.gpus_per_node))
        base = out[0][-1]
        sig = tuple((*x[:-1], x[-1] - base) for x in out)
        if len(self._sigs) > 100_000:
            self._sigs.clear()
        self._sigs[id(r)] = (r, net.cluster, sig, self._grad_elements(r))
        return sig

    def _grad_elements(self, r: Replica) -> float:
        """Largest gradient (in elements) any device of ``r`` all-reduces."""
        n = len(r.stages)
        return max(_stage_params(self.model, *s.layers, j == 0, j == n - 1) / s.tp
                   for j, s in enumerate(r.stages))

    def _stage_s(self, plan: Plan, stage: Stage, nxt: Stage | None, mb: int, net: Network,
                 first: bool, last: bool) -> float:
        """Forward + backward of one micro-batch on ``stage`` (compute, TP and p2p traffic)."""
        m, g = self.model, net.groups[stage.group]
        gpu = gpu_spec(g.gpu)
        tokens = mb * self.seq
        a, b = stage.layers
        fwd = _stage_flops_per_token(m, self.seq, a, b) * tokens
        if last:
            fwd += formulas.head_forward_flops_per_token(m) * tokens
        # backward = 2x forward; full recompute adds one forward (Narayanan et al. SC'21 eq. 3)
        flops = fwd * (4.0 if plan.recompute == "full" else 3.0) / stage.width
        gemm = 2.0 * tokens * m.hidden * m.hidden / stage.tp  # a representative layer GEMM
        rate = gpu.peak_flops(plan.precision) * gpu.matmul_efficiency(gemm)
        t = flops / rate
        act = terms.element_bytes(plan.precision) * tokens * m.hidden  # one micro-batch
        dev0 = (stage.devices or (0,))[0]
        if stage.tp > 1:
            # Megatron TP: 2 all-reduces forward + 2 backward per layer (Shoeybi et al. 2019),
            # each the simulator's ring (hetpar.sim.terms), no latency term in this model
            bw = terms.bytes_per_s(net.within(stage.group, stage.tp, dev0))
            t += (b - a) * 4 * terms.ring_all_reduce(act / stage.cp, stage.tp, bw)
        if nxt is not None:
            bw_g = self._p2p_gbps(stage, nxt, net)
            t += 2 * act / stage.tp / terms.bytes_per_s(bw_g)  # activation out, gradient back
        return t

    def _p2p_gbps(self, s: Stage, nxt: Stage, net: Network) -> float:
        d0, d1 = (s.devices or (0,))[0], (nxt.devices or (0,))[0]
        if s.group == nxt.group:
            lo, hi = min(d0, d1), max(d0, d1)
            return net.within(s.group, hi - lo + 1, lo)
        bw = net.between(s.group, nxt.group)
        if bw is None:
            raise Infeasible("network", f"groups {s.group!r} and {nxt.group!r} are partitioned")
        return bw

    def _pipeline_s(self, plan: Plan, r: Replica, net: Network) -> float:
        """1F1B over heterogeneous stages: all stages once, then (m - 1) x the slowest.

        For uniform stages this is Narayanan et al.'s (m + p - 1) t_stage (SC'21 Sec. 2.2).
        """
        pp, n = plan.pp_of(r), len(r.stages)
        times = [0.0] * pp
        for j, s in enumerate(r.stages):
            nxt = r.stages[j + 1] if j + 1 < n else None
            times[j % pp] += self._stage_s(plan, s, nxt, r.micro_batch, net, j == 0, j == n - 1)
        for rank in range(pp):
            self._check_memory(plan, r, rank, list(r.stages[rank::pp]), net)
        return sum(times) + (r.num_microbatches - 1) * max(times)

    def _check_memory(self, plan: Plan, r: Replica, rank: int, chunks: list[Stage],
                      net: Network) -> None:
        m, s0 = self.model, chunks[0]
        gpu = gpu_spec(net.groups[s0.group].gpu)
        dp = len(plan.replicas)
        w, g, opt = terms.state_bytes_per_param(plan.precision, self.job.optimizer)
        k = opt / (dp if plan.zero >= 1 else 1)
        params = sum(_stage_params(m, *c.layers, c is r.stages[0], c is r.stages[-1])
                     for c in chunks)
        static = params / s0.tp * (w + g + k)
        in_flight = min(plan.pp_of(r) - rank, r.num_microbatches)
        act = sum(
            formulas.activation_bytes_per_layer(
                m, self.seq, r.micro_batch, tp=s0.tp, sp=plan.sequence_parallel, cp=s0.cp,
                recompute=plan.recompute, flash_attention=True) * c.n_layers
            for c in chunks
        ) * in_flight
        # outside the allocator, and what it holds beyond the live tensors (sim/memory.py)
        need = ((static + act) * (1 + self.profile.allocator_fragmentation)
                + self.profile.reserved_memory_bytes)
        cap = gpu.memory_bytes
        if need > cap:
            raise Infeasible(
                "memory",
                f"stage on {s0.group!r} needs {need / 2**30:.1f} GiB of {cap / 2**30:.1f}",
            )

    def _dp_s(self, n: int, per_group: dict[str, int], grad_bytes: float, net: Network) -> float:
        """Ring all-reduce of the gradients across ``n`` replicas, at the ring's slowest hop."""
        if n == 1:
            return 0.0
        groups = sorted(per_group)
        bws = [net.within(g, net.groups[g].num_gpus) for g in groups if per_group[g] > 1]
        for a, b in zip(groups, groups[1:], strict=False):
            bw = net.between(a, b)
            if bw is None:
                raise Infeasible("network", f"groups {a!r} and {b!r} are partitioned")
            bws.append(bw)
        return terms.ring_all_reduce(grad_bytes, n, terms.bytes_per_s(min(bws)))


