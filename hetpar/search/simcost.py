"""The planner's cost model over the simulator: probes for stage costs, ``simulate`` to rank."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hetpar import formulas, schedules
from hetpar.errors import ConfigError
from hetpar.search.costmodel import Evaluation, StageCost, StageKey, StateBytes
from hetpar.search.pipeline import pipeline_weights
from hetpar.search.simtail import SimTail
from hetpar.sim import axis_costs
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.collectives import NetworkModel
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

if TYPE_CHECKING:
    from hetpar.search.candidates import Knobs
    from hetpar.search.structures import Structure
    from hetpar.sim import MemoryRow


@dataclass
class SimCostModel:
    """``CostModel`` backed by ``hetpar.sim.simulate``.

    Stage costs come from the simulator itself, by differences of tiny probe runs on one
    GPU group (1 and 2 layers, 1 and 2 micro-batches, no pipeline and no data parallelism
    beyond the replicas a costed plan-scope axis's group needs, ``_probe_replicas``):
    the per-micro-batch time of one layer is T(2,2) - T(2,1) - T(1,2) + T(1,1), and so on.
    The probe cannot tell the embedding from the head on a single rank, so their time is
    charged to the last rank, where the output GEMM (2 V h FLOPs per token) dominates.
    """

    model: ModelSpec
    cluster: ClusterSpec
    job: Job
    slack: float = 1.05
    """Upper bounds from probe costs and the approximate pipeline formula of
    ``pipeline_weights`` can undershoot the simulator's own schedule by a few percent
    (interleaved schedules on uneven stages); the slack keeps them bounds in practice, and
    ``SearchStats.bound_violations`` counts any that still fail."""
    zero_dominated: tuple[tuple[int, int], ...] = ((1, 2),)
    """(a, b): ZeRO stage a is never faster than stage b in ``simulate`` and needs at least
    as much memory (``sim/structure.py`` ``_dp_sync``: stages 1 and 2 both reduce-scatter the
    gradients and all-gather the weights, step the same ZeRO-sharded optimizer share, and
    differ only in stage 2 sharding the gradients' memory; Rajbhandari et al. 2020 Sec. 7).
    Where both are in the space the planner does not generate stage a (rule ``dominated``).
    ZeRO-0 is not dominated: its all-reduce may take NCCL's tree algorithm, which the
    reduce-scatter + all-gather pair cannot (NCCL runs tree for all-reduce only; ``hetpar.net.
    collectives.nccl_lines``), so on large DP groups over high-latency links (256 replicas of
    OPT-350M on GCP A100 + V100 VMs, ``bench/search_peers.py``) it is the faster stage."""
    _topo: Any = field(default=None, repr=False)
    _cache: dict[StageKey, StageCost] = field(default_factory=dict, repr=False)
    _tail: SimTail | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # the probes resize the model to 1 and 2 layers (_probe), which a list per layer
        # cannot follow: refused in one line instead of failing inside ModelSpec
        listed = [f for f in ("layer_kinds", "moe_layer_pattern")
                  if getattr(self.model, f) is not None]
        if listed:
            raise ConfigError(f"plan: model {self.model.name!r} sets {listed[0]} (one entry per "
                              "layer), which the planner's 1- and 2-layer probe models cannot "
                              "keep; simulate a plan of it instead")

    def _probe(self, key: StageKey, layers: int, microbatches: int) -> tuple[float, MemoryRow]:
        from hetpar.sim import simulate

        mdl = _probe_model(self.model, layers)
        dp = _probe_replicas(key)
        plan = Plan(
            tp=key.tp,
            pp=1,
            dp=dp,
            cp=key.cp,
            micro_batch=key.micro_batch,
            global_batch=key.micro_batch * microbatches * dp,
            group=key.group,
            sequence_parallel=key.sequence_parallel,
            recompute=key.recompute,  # type: ignore[arg-type]
            zero=0,
            schedule=schedules.DEFAULT,
            precision=self.job.precision,
            **_plan_axes(key),
        )
        job = replace(self.job, global_batch=plan.batch)
        rep = simulate(mdl, self.cluster, plan, job)
        return rep.iteration_time_s, rep.memory[0]

    def stage_cost(self, key: StageKey) -> StageCost:
        """Per-layer time and memory of ``key`` from four probe simulations (cached)."""
        if key in self._cache:
            return self._cache[key]
        t11, row1 = self._probe(key, 1, 1)
        t12, _ = self._probe(key, 1, 2)
        t21, row2 = self._probe(key, 2, 1)
        t22, _ = self._probe(key, 2, 2)
        layer_t = max(1e-12, (t22 - t21) - (t12 - t11))
        ends_t = max(0.0, (t12 - t11) - layer_t)
        r1, r2 = row1, row2
        layer = StateBytes(
            params=r2.params - r1.params,
            grads=r2.grads - r1.grads,
            optimizer=r2.optimizer - r1.optimizer,
        )
        half = StateBytes(
            params=max(0.0, r1.params - layer.params) / 2,
            grads=max(0.0, r1.grads - layer.grads) / 2,
            optimizer=max(0.0, r1.optimizer - layer.optimizer) / 2,
        )
        act = max(0.0, r2.activations - r1.activations)
        fixed = r1.other + max(0.0, r1.activations - act)
        out = StageCost(
            layer_time_s=layer_t,
            embed_time_s=0.0,
            head_time_s=ends_t,
            layer_state=layer,
            embed_state=half,
            head_state=half,
            layer_activation_bytes=act,
            fixed_bytes=fixed,
            capacity_bytes=r1.capacity,
            expert_state=self._expert_state(key),
        )
        self._cache[key] = out
        return out

    def _expert_state(self, key: StageKey) -> StateBytes | None:
        """Per GPU, the routed experts' states of one MoE layer when ep > 1: / ep / etp
        (``sim.moe.expert_params_per_gpu``), at the job's bytes per parameter."""
        from hetpar.sim.memory import state_bytes_per_param
        from hetpar.sim.moe import routed_params

        d = dict(key.axes)
        ep = d.get("ep", 1)
        if ep == 1 or self.model.n_experts == 1:
            return None
        n = routed_params(self.model, formulas.first_moe_layer(self.model)) / ep / d.get("etp", 1)
        wb, gb, ob = state_bytes_per_param(self.job.precision, self.job.optimizer)
        return StateBytes(params=n * wb, grads=n * gb, optimizer=n * ob)

    def boundary_time(self, a: StageKey, b: StageKey, same_node: bool) -> float:
        """The simulator's blocking p2p send of one micro-batch's activations (split over
        the sender's TP ranks) between representative devices of the two groups."""
        from hetpar.sim import network as net
        from hetpar.sim.layer import ACT_BYTES

        if self._topo is None:
            self._topo = net.Topology(self.cluster)
        ga = self.cluster.group(a.group)
        if a.group == b.group:
            other = 1 if same_node or ga.num_nodes == 1 else ga.gpus_per_node
            devs = [(a.group, 0), (b.group, min(other, ga.num_gpus - 1))]
        else:
            devs = [(a.group, 0), (b.group, 0)]
        path = self._topo.p2p_path(devs[0], devs[1])
        seq = self.job.seq_len or self.model.seq_len
        nbytes = a.micro_batch * (seq // a.cp) * self.model.hidden * ACT_BYTES[self.job.precision]
        return float(net.p2p(path, nbytes / a.tp))

    def pipeline_weights(
        self, schedule: str, pp: int, vpp: int, microbatches: int
    ) -> tuple[float, float]:
        return pipeline_weights(schedule, pp, vpp, microbatches)

    def bound_slack(self) -> float:
        return self.slack

    def tail_lower_bound(
        self, structure: Structure, knobs: Knobs, first_layers: Sequence[int]
    ) -> tuple[float, ...]:
        """Gradient sync, optimizer step and iteration overhead that ``simulate`` adds after
        each class's pipeline, at least (``simtail.SimTail``)."""
        if self._tail is None:
            self._tail = SimTail(self.model, self.cluster, self.job)
        return self._tail.per_class(structure, knobs.cp, knobs.zero, first_layers,
                                    knobs.zero_scope)

    prices_networks = True
    """``evaluate`` takes an alternative network model (``--objective robust``)."""

    def evaluate(self, plan: Plan, network: NetworkModel | None = None) -> Evaluation:
        """``simulate`` the plan (under ``network``, an alternative model of the fabric);
        Infeasible propagates, OOM is flagged."""
        from hetpar.ranking import bundled_bands, cluster_widening, interval
        from hetpar.sim import simulate

        rep = simulate(self.model, self.cluster, plan, self.job, network=network)
        peak = max((r.total / r.capacity for r in rep.memory), default=0.0)
        report = rep.to_dict()
        # the 80% band of the held-out residuals of this framework's runs (ranking.py); the
        # robust objective reads it instead of its default width (search/robust.py)
        band = interval(rep.tokens_per_s, self.job.framework or "default", bundled_bands(),
                        widen=cluster_widening(self.cluster))
        if band is not None:
            report["tokens_per_s_interval"] = list(band)
        return Evaluation(
            iteration_time_s=rep.iteration_time_s,
            tokens_per_s=rep.tokens_per_s,
            num_gpus=rep.num_gpus,
            mfu=rep.mfu,
            oom=rep.oom,
            bottleneck=rep.bottleneck,
            breakdown=dict(rep.breakdown),
            peak_memory_fraction=peak,
            report=report,
        )


def _probe_model(model: ModelSpec, layers: int) -> ModelSpec:
    """``model`` cut to ``layers`` layers for a probe. A model whose layers are not all alike
    (DeepSeek-V3's first 3 dense layers, an interleaved or explicit MoE pattern) is probed
    with MoE layers only: a 1- or 2-layer cut of its pattern would not be its layers (and
    3 leading dense layers do not fit in 1). The planner then prices each layer as an MoE
    one, the costlier kind in time and memory (expert weights, router, all-to-all), so its
    memory rule stays conservative; ``simulate`` ranks the plans on the real pattern."""
    if model.n_experts == 1 or all(model.moe_layer_flags):
        return replace(model, n_layers=layers)
    return replace(model, n_layers=layers, first_dense_layers=0, moe_layer_interval=1,
                   moe_layer_pattern=None)


def _probe_replicas(key: StageKey) -> int:
    """Replicas of a probe: 1, or the lcm of the degrees of ``key``'s costed plan-scope axes,
    whose groups are data-parallel peers (``sim.axis_costs.AxisCost``); an expert-view axis
    (ep) is carved from dp x cp, x tp when etp = 1 (``placement.experts``), so it needs only
    the replicas the other factors lack. Their gradient sync depends on the layers, not the
    micro-batches, so it cancels in ``stage_cost``'s differences, and ZeRO 0 keeps the memory
    per GPU that of one replica."""
    rows = {a.name for a in axes.of_scope("plan")}
    etp = dict(key.axes).get("etp", 1)
    inner = key.cp * (key.tp if etp == 1 else 1)
    need = [d // math.gcd(d, inner) if axis_costs.COSTS[n].expert_view else d
            for n, d in key.axes if n in rows and n in axis_costs.COSTS]
    return math.lcm(1, *need)


def _plan_axes(key: StageKey) -> dict[str, Any]:
    """The plan-scope axes of ``key`` as the ``Plan`` keyword (``Knobs.plan_axes``)."""
    named = tuple((n, d) for n, d in key.axes if d != 1)
    return {"axes": named} if named else {}
