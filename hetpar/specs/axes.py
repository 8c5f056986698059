"""The parallel axes as one table: what the placement, feasibility, planner, exports and run read.

Every axis is one ``AxisDef`` row: where its degree lives (``scope``), the feasibility
predicate that bounds it, its traffic, and what executes it. ``hetpar.placement`` names its
axes from these rows, ``hetpar.feasibility.plan_verdicts`` asks the predicate of every
``plan``-scope axis, the planner searches their degrees (``SearchSpace.axes``, else
``searched``) and passes them to the cost model and the plans it writes, the exporters
refuse what ``exported`` says no target carries and the runtime refuses what ``runtime``
says it does not execute (``runtime/layout.py::_check_supported``), each naming the axis.

A ``plan`` row's degree lives in ``Plan.axes`` (a file or inline plan names it by its own
key, ``ep = 2``) and its groups are the mesh's (``Mesh.groups(name)``: data-parallel peers).
The table is data only: the callables an axis names live where they run, registered by its
name, its predicate in ``hetpar.feasibility.PREDICATES`` and what the simulator charges it
(the collective it runs per layer and what it shards) in ``hetpar.sim.axis_costs.COSTS``.
A new plan-scope axis is a row here (``register``) plus its predicate (and its cost);
see docs/extending.md "A parallel axis".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError

Scope = Literal["stage", "replicas", "pipeline", "plan"]


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

    def __post_init__(self) -> None:
        if not self.searched or any(d < 1 for d in self.searched):
            raise ConfigError(f"axis {self.name}: searched degrees must be >= 1, "
                              f"got {list(self.searched)}")


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

PLAN_AXES: tuple[AxisDef, ...] = (
    # Expert parallelism: the experts of each MoE layer split over ep ranks carved from
    # dp x cp (x tp when etp = 1), as torchtitan's sparse mesh (hetpar.placement.experts);
    # its cost is hetpar.sim.moe's. runtime: hetpar's trainer does not execute it yet (issue
    # 31 item 7) and refuses it naming the axis; exported: the Megatron-LM export writes it
    # (--expert-model-parallel-size), the other targets refuse it (export.nearest.common).
    AxisDef(name="ep", scope="plan", predicate="expert_split", runtime=False, exported=True,
            collective="all-to-all of routed tokens (dispatch and combine) over the ep group; "
                       "expert gradients reduced over the edp group"),
    # Expert tensor parallelism: 1 (experts whole on each rank) or tp (split as the dense MLP).
    AxisDef(name="etp", scope="plan", predicate="expert_tp", runtime=False, exported=True,
            collective="none of its own: the experts' TP collectives are the layer's"),
)
"""The bundled ``plan``-scope axes: expert parallelism and expert tensor parallelism; a
plugin adds more with ``register`` (docs/extending.md)."""

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
