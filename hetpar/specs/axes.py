"""The parallel axes as one table: what the placement, feasibility, planner, exports and run read.

Every axis is one ``AxisDef`` row: where its degree lives (``scope``), the feasibility
predicate that bounds it, its traffic, and what executes it. ``hetpar.placement`` names its
axes from these rows, ``hetpar.feasibility.plan_verdicts`` asks the predicate of every
``plan``-scope axis, the planner searches their degrees (``SearchSpace.axes``, else
``searched``) and passes them to the cost model and the plans it writes, the exporters
refuse what ``exported`` says no target carries and the runtime refuses what ``runtime``
says it does not execute (``runtime/layout.py::_check_supported``), each naming the axis.

A ``plan`` row's degree lives in ``Plan.axes`` (a file or inline plan names it by its own
key, ``ep = 2``), its groups are the placement's (``Placement.groups``: data-parallel peers),
and its ``cost`` (an ``AxisCost``) is what the simulator charges it: the collective it runs
per layer and what it shards; ``hetpar.sim`` reads it with no per-axis code. A new
plan-scope axis is a row here (``register``) plus its predicate in ``hetpar.feasibility``;
see docs/extending.md "A parallel axis".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.specs.model import ModelSpec

Scope = Literal["stage", "replicas", "pipeline", "plan"]
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


@dataclass(frozen=True, kw_only=True)
class AxisCost:
    """What the simulator charges a ``plan``-scope axis at a degree > 1 (``hetpar.sim``).

    Its group, on every pipeline rank, is ``degree`` data-parallel peers of that rank (the
    axis is carved out of the data-parallel ranks, as expert parallelism is; the degree must
    divide the data-parallel degree): replicas ``i // degree * degree`` onwards.
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


@dataclass(frozen=True, kw_only=True)
class AxisDef:
    """One parallel axis and what every part of hetpar needs to know about it."""

    name: str
    scope: Scope
    """``stage``: a ``Stage`` field whose degree multiplies the stage's devices (tp, cp);
    ``replicas``: the number of replicas (dp); ``pipeline``: ranks per replica (pp);
    ``plan``: one degree for the whole plan (``Plan.axes``) that places no devices of its
    own (as expert parallelism is carved out of the data-parallel ranks)."""
    predicate: str
    """Name of the ``hetpar.feasibility`` predicate its degree must satisfy. For a ``plan``
    axis it is a ``feasibility.PREDICATES`` entry called as ``(model, degree, degrees)``
    (``degrees``: the plan's largest degree per axis) and returning a ``Verdict``."""
    collective: str
    """The traffic the axis adds (what the simulator must charge for it)."""
    runtime: bool = True
    """Whether ``hetpar run`` executes degrees > 1; if not, it refuses them, naming the axis."""
    exported: bool = True
    """Whether an export target carries degrees > 1 (``plan`` axes; stage axes are folded by
    ``export/nearest.py::to_uniform`` and each target's own rules); if not, export refuses."""
    searched: tuple[int, ...] = (1,)
    """``plan`` axes: the degrees the planner tries unless the space names others."""
    cost: AxisCost | None = None
    """``plan`` axes: what the simulator charges it; None: nothing (its degree costs 0)."""

    def __post_init__(self) -> None:
        if not self.searched or any(d < 1 for d in self.searched):
            raise ConfigError(f"axis {self.name}: searched degrees must be >= 1, "
                              f"got {list(self.searched)}")
        if self.cost is not None and self.scope != "plan":
            raise ConfigError(f"axis {self.name}: only plan-scope axes carry a cost "
                              f"(the device axes' costs are hetpar.sim's own), got {self.scope}")


BUILTIN: tuple[AxisDef, ...] = (
    AxisDef(name="tp", scope="stage", predicate="tp_shards",
            collective="all-reduce, or reduce-scatter + all-gather with SP, of activations"),
    # runtime: hetpar's trainer has no ring attention (docs/runtime.md)
    AxisDef(name="cp", scope="stage", predicate="context_split", runtime=False,
            collective="all-gather and reduce-scatter of K/V along the sequence ring"),
    AxisDef(name="dp", scope="replicas", predicate="batch_split",
            collective="all-reduce (ZeRO: reduce-scatter + all-gather) of gradients"),
    AxisDef(name="pp", scope="pipeline", predicate="layers_per_chunk",
            collective="p2p of activations forward, of their gradients backward"),
)
"""The device axes, in ``AXES`` order (``Plan.order`` permutes them)."""

PLAN_AXES: tuple[AxisDef, ...] = ()
"""The bundled ``plan``-scope axes (none yet; expert parallelism would be the first row:
``AxisDef(name="ep", scope="plan", predicate="expert_split", collective="all-to-all of
tokens", cost=AxisCost(...))``, docs/extending.md shows it as a plugin); a plugin adds one
with ``register``."""

_REGISTRY: dict[str, AxisDef] = {a.name: a for a in BUILTIN + PLAN_AXES}


def register(axis: AxisDef) -> AxisDef:
    """Add a ``plan``-scope axis (the device axes are built in: ``expand`` lays them out)."""
    if axis.scope != "plan":
        raise ConfigError(f"axis {axis.name}: only plan-scope axes can be registered; "
                          "stage, replica and pipeline axes are laid out by specs.expand.expand")
    if axis.name in _REGISTRY:
        raise ConfigError(f"axis {axis.name!r} is already registered")
    import dataclasses

    from hetpar.specs.plan import Plan  # here: plan.py reads this table at import

    taken = {f.name for f in dataclasses.fields(Plan)}
    if axis.name in taken:  # its degree would shadow the plan key of that name in files
        raise ConfigError(f"axis {axis.name!r}: the name is a plan field; choose another")
    _REGISTRY[axis.name] = axis
    return axis


def unregister(name: str) -> None:
    """Remove a registered ``plan``-scope axis (tests)."""
    if name in {a.name for a in BUILTIN}:
        raise ConfigError(f"axis {name!r} is built in")
    _REGISTRY.pop(name, None)


def axes() -> tuple[AxisDef, ...]:
    """Every axis, the built-in device axes first, then the registered ones in order."""
    return tuple(_REGISTRY.values())


def get(name: str) -> AxisDef:
    """The row of ``name``; ConfigError naming the known axes otherwise."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown parallel axis {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def of_scope(scope: Scope) -> tuple[AxisDef, ...]:
    """The axes of one scope, in table order."""
    return tuple(a for a in _REGISTRY.values() if a.scope == scope)


def plan_degrees(obj: object) -> tuple[tuple[str, int], ...]:
    """``(name, degree)`` of every ``plan``-scope axis of ``obj`` (a Plan: its ``axes``, which
    leave out degree 1), 1 for every axis it does not name."""
    named = dict(getattr(obj, "axes", ()))
    return tuple((a.name, int(named.get(a.name, 1))) for a in of_scope("plan"))


def costed(obj: object) -> tuple[tuple[AxisDef, int], ...]:
    """``(row, degree)`` of every ``plan``-scope axis of ``obj`` (a Plan) that has a cost and
    a degree > 1: what the simulator charges (empty for every plan today)."""
    if not getattr(obj, "axes", ()):  # the common case, on the simulator's hot path
        return ()
    rows = {a.name: a for a in of_scope("plan")}
    return tuple((rows[n], d) for n, d in plan_degrees(obj) if d > 1 and rows[n].cost)


def cost_keys() -> tuple[tuple[str, str], ...]:
    """``(breakdown key, bottleneck word)`` of every registered axis with a cost."""
    return tuple((a.cost.key, a.cost.word) for a in of_scope("plan") if a.cost)
