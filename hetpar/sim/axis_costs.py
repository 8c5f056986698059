"""What the simulator charges each plan-scope axis, registered by axis name (``COSTS``).

As ``feasibility.PREDICATES`` holds the predicates the axis rows of ``specs/axes.py`` name,
this registry holds their costs: the row stays data (name, scope, predicate, ...) and the
callables live with the simulator that runs them. A plan-scope axis's cost is an ``AxisCost``
(``register(name, cost)``); the simulator reads it with no per-axis code
(``sim/axis_terms.py``, ``sim/layout.py``, ``sim/report.py::breakdown_keys``) and so does the
simulator-backed planner's probe (``search/simcost.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hetpar.errors import ConfigError
from hetpar.specs import axes
from hetpar.specs.model import ModelSpec

if TYPE_CHECKING:
    from hetpar.sim.network import GroupShape
    from hetpar.sim.profile import FrameworkProfile

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
"""The collectives the simulator prices (``hetpar.sim.network``, NCCL's algorithms)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AxisLayer:
    """What a ``plan`` axis's cost hook sees of one layer of one model chunk."""

    model: ModelSpec
    layer: int
    """The layer's index in the model (``formulas.is_moe_layer`` tells its kind)."""
    tokens: int
    """Tokens of one micro-batch on one GPU: micro_batch x seq / cp."""
    tp: int
    degree: int
    """The axis's degree in the plan."""
    element_bytes: int
    """Bytes of one activation element at the plan's precision."""
    share: float = 1.0
    """Max / mean of what the group's busiest member receives beyond its even share (an
    uneven expert split, ``sim.expert_split.Split.a2a_share``); 1.0: even."""


@dataclass(frozen=True, kw_only=True)
class AxisCost:
    """What the simulator charges a ``plan``-scope axis at a degree > 1.

    Its group, on every pipeline rank, is ``degree`` data-parallel peers of that rank (the
    axis is carved out of the data-parallel ranks, as expert parallelism is; the degree must
    divide the data-parallel degree): replicas ``i // degree * degree`` onwards, the mesh's
    ``groups(name)`` (``hetpar.placement``).
    """

    key: str
    """Its term in the simulator's time breakdown (``Report.breakdown``), e.g. ``ep_comm``."""
    word: str
    """``Report.bottleneck`` when that term is the largest, e.g. ``ep-link``."""
    op: Op
    nbytes: Callable[[AxisLayer], float]
    """Bytes per GPU of one of its collectives in one layer for one micro-batch (0: none)."""
    calls: tuple[int, int] = (1, 1)
    """Collectives per layer in the forward and in the backward (full recompute repeats the
    forward's); charged on the chunk's critical path, with nothing overlapped."""
    sharded_params: Callable[[ModelSpec, int], float] | None = None
    """Parameters of layer ``i`` the axis divides by its degree (before TP: the simulator
    divides by the stage's tp as for every weight). Weights, gradients, optimizer state, the
    data-parallel gradient bytes and the optimizer step follow the smaller share."""
    time: Callable[[GroupShape, AxisLayer, FrameworkProfile], float] | None = None
    """Seconds of one of its collectives on a group of that shape, where a framework runs it
    its own way (the profile says how: e.g. DeepEP's dispatch); None: ``op`` of ``nbytes``."""
    overlap: Callable[[FrameworkProfile], float] | None = None
    """Share of its time the framework hides behind another micro-batch's compute, capped
    by that compute (the chunk's forward and backward GEMMs, attention and elementwise work
    for one micro-batch); None: nothing hidden."""
    hidden: Callable[[float, float, float], float] | None = None
    """Seconds of one layer's collectives (each of the given seconds) that can run beside
    another micro-batch's compute, given that layer's attention-block and MLP forward seconds
    (backward: twice each); None: up to the layer's whole compute."""
    overlap_sms: Callable[[FrameworkProfile], int] | None = None
    """SMs its kernels hold while hidden behind compute: that compute runs on the rest (GPUSpec
    .sm_count), so each hidden second costs sms / sm_count of a second; None: none."""
    expert_view: bool = False
    """Its groups are the mesh's expert view (``Mesh.with_experts(ep, etp)``: carved from
    dp x cp, x tp when etp = 1), not runs of data-parallel peers."""


@dataclass(frozen=True)
class Charged:
    """A plan-scope axis the simulator charges: its name and its registered cost."""

    name: str
    cost: AxisCost


COSTS: dict[str, AxisCost] = {}
"""The registered costs, by axis name (bundled: ``ep``, ``hetpar.sim.moe``)."""


def register(name: str, cost: AxisCost) -> AxisCost:
    """Charge the registered plan-scope axis ``name`` with ``cost`` (ConfigError if it is
    not a registered plan-scope axis: the device axes' costs are the simulator's own)."""
    row = axes.get(name)
    if row.scope != "plan":
        raise ConfigError(f"axis {name}: only plan-scope axes carry a cost "
                          f"(the device axes' costs are hetpar.sim's own), got {row.scope}")
    COSTS[name] = cost
    return cost


def unregister(name: str) -> None:
    """Remove ``name``'s cost (tests)."""
    COSTS.pop(name, None)


def costed(obj: object) -> tuple[tuple[Charged, int], ...]:
    """``(axis, degree)`` of every registered ``plan``-scope axis of ``obj`` (a Plan) with a
    cost and a degree > 1: what the simulator charges (empty for every plan today)."""
    if not getattr(obj, "axes", ()):  # the common case, on the simulator's hot path
        return ()
    return tuple((Charged(n, COSTS[n]), d) for n, d in axes.plan_degrees(obj)
                 if d > 1 and n in COSTS)


def cost_keys() -> tuple[tuple[str, str], ...]:
    """``(breakdown key, bottleneck word)`` of every registered plan-scope axis with a cost."""
    return tuple((COSTS[a.name].key, COSTS[a.name].word) for a in axes.of_scope("plan")
                 if a.name in COSTS)
