"""The cost-model protocol the planner searches against, and the small types it exchanges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hetpar.specs.plan import Plan

if TYPE_CHECKING:
    from hetpar.search.candidates import Knobs
    from hetpar.search.structures import Structure


@dataclass(frozen=True, kw_only=True)
class StageKey:
    """What a stage's per-layer cost depends on: where it runs and how it is sharded."""

    group: str
    tp: int
    cp: int = 1
    sequence_parallel: bool = False
    micro_batch: int = 1
    recompute: str = "none"
    axes: tuple[tuple[str, int], ...] = ()
    """The plan-scope axes' degrees (``Knobs.axes``): a cost model passes them on to the
    plan it costs (``Knobs.plan_axes``)."""


@dataclass(frozen=True, kw_only=True)
class StateBytes:
    """Per-GPU bytes of weights, gradients and optimizer state (before ZeRO sharding)."""

    params: float
    grads: float
    optimizer: float

    def sharded(self, zero: int, dp: int) -> float:
        """Bytes per GPU after ZeRO stage ``zero`` over ``dp`` replicas (Rajbhandari et al.
        2020: stage 1 shards optimizer state, 2 also gradients, 3 also parameters)."""
        return (
            self.params / (dp if zero >= 3 else 1)
            + self.grads / (dp if zero >= 2 else 1)
            + self.optimizer / (dp if zero >= 1 else 1)
        )


@dataclass(frozen=True, kw_only=True)
class StageCost:
    """Cheap per-stage figures for the layer-split DP (seconds per micro-batch, bytes per GPU)."""

    layer_time_s: float
    """Forward + backward of one transformer layer for one micro-batch."""
    embed_time_s: float
    """Extra time of the first stage (embedding) per micro-batch."""
    head_time_s: float
    """Extra time of the last stage (output head + loss) per micro-batch."""
    layer_state: StateBytes
    embed_state: StateBytes
    head_state: StateBytes
    layer_activation_bytes: float
    """Activations one layer keeps for one in-flight micro-batch, per GPU."""
    fixed_bytes: float
    """Per-GPU memory independent of layers (workspace, framework, fragmentation)."""
    capacity_bytes: float
    expert_state: StateBytes | None = None
    """Of ``layer_state``, the routed experts' share when an expert axis splits them (ep > 1):
    ZeRO shards it over the expert-data-parallel group, not over the replicas
    (``sim.memory.rank_memory``). None: no such share (every state shards over dp)."""

    def layer_bytes(self, zero: int, dp: int, edp: int) -> float:
        """One layer's state bytes per GPU after ZeRO over ``dp`` replicas, the expert share
        over ``edp`` expert-data-parallel peers."""
        e = self.expert_state
        if e is None:
            return self.layer_state.sharded(zero, dp)
        dense = StateBytes(params=self.layer_state.params - e.params,
                           grads=self.layer_state.grads - e.grads,
                           optimizer=self.layer_state.optimizer - e.optimizer)
        return dense.sharded(zero, dp) + e.sharded(zero, edp)


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What the search needs back from evaluating one plan."""

    iteration_time_s: float
    tokens_per_s: float
    num_gpus: int
    mfu: float = 0.0
    oom: bool = False
    bottleneck: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)
    peak_memory_fraction: float = 0.0
    """Largest used / capacity over all pipeline ranks."""
    report: dict[str, object] = field(default_factory=dict)
    """The full simulator report as a dict, when the cost model has one."""


@runtime_checkable
class CostModel(Protocol):
    """A swappable cost model: cheap stage queries for the DP and a full plan evaluation.

    Implementations must be picklable (they are shipped once to worker processes) and
    deterministic (identical results whatever the backend). A model may also implement
    ``TailBounded`` (what it adds after the pipeline); the planner's bounds then use it.
    """

    def stage_cost(self, key: StageKey) -> StageCost:
        """Per-layer time and memory of a stage described by ``key``."""
        ...

    def boundary_time(self, a: StageKey, b: StageKey, same_node: bool) -> float:
        """Seconds per micro-batch that a pipeline boundary from ``a`` to ``b`` adds to each
        of the two ranks (activations forward, their gradients backward)."""
        ...

    def pipeline_weights(
        self, schedule: str, pp: int, vpp: int, microbatches: int
    ) -> tuple[float, float]:
        """``(a, b)`` such that a replica's time is about ``a * max_rank + b * sum_ranks``."""
        ...

    def evaluate(self, plan: Plan) -> Evaluation:
        """Full evaluation of an explicit plan; raises ``Infeasible`` when it does not fit."""
        ...

    def bound_slack(self) -> float:
        """Factor (>= 1) applied to throughput upper bounds built from ``stage_cost``."""
        ...


@runtime_checkable
class TailBounded(Protocol):
    """Optional part of a cost model: what its evaluation adds after the pipeline."""

    def tail_lower_bound(
        self, structure: Structure, knobs: Knobs, first_layers: Sequence[int]
    ) -> tuple[float, ...]:
        """Per replica class of ``structure``: seconds that ``evaluate`` adds at least to
        each replica's pipeline time (gradient sync, optimizer step, fixed overheads) when
        pipeline rank 0 holds at least ``first_layers[c]`` layers. Must be a true lower
        bound: the planner prunes with it and adds no slack to it."""
        ...

