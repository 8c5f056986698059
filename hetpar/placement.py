"""One placement of a plan on a cluster: named axes, every rank's coordinates and device, groups.

``place(model, cluster, plan)`` lays the plan out with ``specs.expand.expand`` (the most complete
placement: uniform plans in ``plan.order``, explicit replicas with their own devices) and numbers
the used devices in cluster order, as ``hetpar run`` does. ``runtime.layout.build_layout`` is a
view of it, and so are the failure studies' ``failures/layout.py``. ``symmetric(plan, group)``
is the symmetry shortcut of the simulator's fast path: a uniform plan whose replicas are
identical up to a shift, its devices by the same formula as ``expand`` (``device_index``),
memoized here by value. ``block_offsets`` lays the planner's replica classes out by the same
formula (``search/structures.py::layout_offsets`` is a view of it). The axes are the rows of
``specs/axes.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from hetpar.errors import ConfigError
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import device_index, expand
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import AXES, Plan


@dataclass(frozen=True, kw_only=True)
class Axis:
    """A parallel axis: its degree, the feasibility predicate that bounds it, its traffic."""

    name: str
    degree: int
    """The largest degree over the replicas (the degree, for a uniform plan)."""
    predicate: str
    """The ``hetpar.feasibility`` predicate (or rule) its degree must satisfy."""
    collective: str


AXIS_RULES: tuple[tuple[str, str, str], ...] = tuple(
    (a.name, a.predicate, a.collective) for a in axes.BUILTIN)
"""(name, predicate, collective) of the device axes: a view of ``specs/axes.py``'s table."""

LAYOUTS: dict[str, str] = {"dp-inner": "tp-cp-dp-pp", "pp-inner": "tp-cp-pp-dp"}
"""The planner's names for two device orders (``Plan.order``): ``dp-inner`` (Megatron's
default: a stage's data-parallel peers side by side) and ``pp-inner`` (a replica's pipeline
side by side). ``block_offsets`` lays replica classes out in them."""


@dataclass(frozen=True, kw_only=True)
class RankPlace:
    """Where one rank runs and its coordinates on every axis."""

    rank: int
    group: str
    device: int
    """Index inside ``group`` (cluster-wide: ``cluster.group_offset(group) + device``)."""
    replica: int
    pp_rank: int
    tp_rank: int
    cp_rank: int
    tp: int
    cp: int
    pp: int
    chunks: tuple[int, ...]
    """Stage indices (model order) this rank runs: j with j % pp == pp_rank."""
    coords: tuple[tuple[str, int], ...] = ()
    """(name, coordinate) on every ``plan``-scope axis of ``specs/axes.py``: its position
    in its group (``Placement.groups``), i.e. in its data-parallel group modulo the degree."""


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The expanded plan, its axes, every rank's place, and the communicator groups."""

    plan: Plan
    """Explicit replicas with every stage's devices assigned."""
    axes: tuple[Axis, ...]
    ranks: tuple[RankPlace, ...]
    stage_ranks: tuple[tuple[tuple[int, ...], ...], ...]
    """``stage_ranks[r][j]``: ranks of stage j of replica r, device order (cp-major, tp inner)."""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def axis(self, name: str) -> Axis:
        return next(a for a in self.axes if a.name == name)

    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """The communicator groups of ``axis``, each in coordinate order.

        tp: per (replica, pp rank, cp rank); cp: per (replica, pp rank, tp rank); pp: per
        (replica, tp rank, cp rank); dp: ranks holding the same shard (same stage layers,
        tp degree, tp rank and cp rank) across replicas; a ``plan``-scope axis of degree d
        (carved out of the data-parallel ranks): each dp group cut into runs of d replicas.
        """
        if axis in {a.name for a in axes.of_scope("plan")}:
            d = self.axis(axis).degree
            return tuple(g[i:i + d] for g in self.groups("dp") for i in range(0, len(g), d))
        keys: dict[str, Callable[[RankPlace], tuple[object, ...]]] = {
            "tp": lambda p: (p.replica, p.pp_rank, p.cp_rank),
            "cp": lambda p: (p.replica, p.pp_rank, p.tp_rank),
            "pp": lambda p: (p.replica, p.tp_rank, p.cp_rank),
            "dp": lambda p: (self._layers(p), p.tp, p.tp_rank, p.cp_rank),
        }
        order: dict[str, Callable[[RankPlace], int]] = {
            "tp": lambda p: p.tp_rank, "cp": lambda p: p.cp_rank,
            "pp": lambda p: p.pp_rank, "dp": lambda p: p.replica,
        }
        if axis not in keys:
            raise ConfigError(f"placement: unknown axis {axis!r}; known: {', '.join(keys)}")
        found: dict[tuple[object, ...], list[RankPlace]] = {}
        for p in self.ranks:
            found.setdefault(keys[axis](p), []).append(p)
        return tuple(tuple(q.rank for q in sorted(g, key=order[axis])) for g in found.values())

    def _layers(self, p: RankPlace) -> tuple[tuple[int, int], ...]:
        stages = self.plan.replicas[p.replica].stages
        return tuple(stages[j].layers for j in p.chunks)


def place(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Placement:
    """Lay ``plan`` out on ``cluster``: ranks are the used devices in cluster order.

    Raises Infeasible when the plan does not fit the cluster (``expand``) and ConfigError when
    two stages of an explicit plan claim one device.
    """
    full = expand(plan, model, cluster)
    used = sorted({
        cluster.group_offset(s.group) + d
        for r in full.replicas for s in r.stages for d in s.devices or ()
    })
    index = {g: i for i, g in enumerate(used)}
    stage_ranks = tuple(
        tuple(tuple(index[cluster.group_offset(s.group) + d] for d in s.devices or ())
              for s in r.stages)
        for r in full.replicas
    )
    found: dict[int, RankPlace] = {}
    for ri, (rep, ranks) in enumerate(zip(full.replicas, stage_ranks, strict=True)):
        pp = full.pp_of(rep)
        for p in range(pp):
            st = rep.stages[p]
            chunks = tuple(j for j in range(len(ranks)) if j % pp == p)
            for k, rank in enumerate(ranks[p]):
                if rank in found:
                    raise ConfigError(f"plan: device of rank {rank} is used by two stages")
                assert st.devices is not None
                found[rank] = RankPlace(
                    rank=rank, group=st.group, device=st.devices[k], replica=ri, pp_rank=p,
                    tp_rank=k % st.tp, cp_rank=k // st.tp, tp=st.tp, cp=st.cp, pp=pp,
                    chunks=chunks,
                )
    assert sorted(found) == list(range(len(used)))
    reps = full.replicas
    plan_axes = axes.plan_degrees(plan)
    degree = {
        "tp": max(s.tp for r in reps for s in r.stages),
        "cp": max(s.cp for r in reps for s in r.stages),
        "dp": len(reps),
        "pp": max(full.pp_of(r) for r in reps),
    }
    degree.update(plan_axes)
    found_axes = tuple(Axis(name=a.name, degree=degree[a.name], predicate=a.predicate,
                            collective=a.collective) for a in axes.axes())
    out = Placement(plan=full, axes=found_axes, ranks=tuple(found[i] for i in range(len(used))),
                    stage_ranks=stage_ranks)
    return _with_coords(out, plan_axes) if plan_axes else out


def _with_coords(pl: Placement, plan_axes: Sequence[tuple[str, int]]) -> Placement:
    """``pl`` with every rank's coordinate on each plan-scope axis: its position in its
    data-parallel group (replica order) modulo the degree."""
    pos = {r: i for g in pl.groups("dp") for i, r in enumerate(g)}
    ranks = tuple(replace(p, coords=tuple((n, pos[p.rank] % d) for n, d in plan_axes))
                  for p in pl.ranks)
    return replace(pl, ranks=ranks)


BlockClass = tuple[int, Sequence[tuple[str, int]], str]
"""(replicas, pipeline ranks as (node group, devices per rank), layout name of ``LAYOUTS``)."""


def block_offsets(classes: Sequence[BlockClass]) -> dict[tuple[int, int, int], int]:
    """First device (inside its group) of rank r of replica i of class ci, keyed (ci, i, r).

    Each class takes, on every node group it uses, the next free block of that group; inside
    the block its replicas' ranks on that group are laid out by ``device_index`` in the
    class's order (``LAYOUTS``), with one rank's devices as the innermost (tp, cp) block:
    the formula ``expand`` lays a uniform plan out with. The ranks of one class on one
    group have one width (the planner's structures give a group one TP degree per class).
    """
    cursor: dict[str, int] = {}
    out: dict[tuple[int, int, int], int] = {}
    for ci, (count, ranks, layout) in enumerate(classes):
        order = LAYOUTS[layout].split("-")
        local: dict[str, list[int]] = {}
        for r, (group, _) in enumerate(ranks):
            local.setdefault(group, []).append(r)
        for group, rs in local.items():
            widths = {ranks[r][1] for r in rs}
            assert len(widths) == 1, f"class {ci} has ranks of widths {widths} on {group}"
            w = widths.pop()
            degrees = {"tp": w, "cp": 1, "dp": count, "pp": len(rs)}
            start = cursor.get(group, 0)
            # device_index is linear in the coordinates: its strides once, not per device
            dp_step, pp_step = (device_index({a: int(a == axis) for a in order}, degrees, order)
                                for axis in ("dp", "pp"))
            for i in range(count):
                for p, r in enumerate(rs):
                    out[(ci, i, r)] = start + i * dp_step + p * pp_step
            cursor[group] = start + w * count * len(rs)
    return out


@dataclass(frozen=True, kw_only=True)
class Symmetric:
    """A uniform plan on one node group seen through its symmetry: replica ``d`` is replica
    0 shifted by ``d`` blocks, so one replica (and one rank per DP group) stands for all.

    ``device(t, c, d, p)`` is the device (inside ``group``) of TP rank t, CP rank c, replica
    d, pipeline rank p, the same formula ``expand`` lays the plan out with. ``memo`` holds
    what a consumer derives from this placement on one network (the simulator's chunks and
    DP group shapes), keyed by that consumer's own value keys.
    """

    group: str
    offset: int
    """First device of ``group`` in cluster order."""
    degrees: tuple[tuple[str, int], ...]
    order: tuple[str, ...]
    memo: dict[object, object] = field(default_factory=dict, compare=False, hash=False,
                                       repr=False)

    def degree(self, axis: str) -> int:
        return dict(self.degrees)[axis]

    def device(self, t: int, c: int, d: int, p: int) -> int:
        return device_index({"tp": t, "cp": c, "dp": d, "pp": p}, dict(self.degrees),
                            list(self.order))


def symmetric(plan: Plan, cluster: ClusterSpec) -> Symmetric | None:
    """The symmetric view of a uniform ``plan`` that fits on one node group, else None."""
    if not plan.uniform:
        return None
    g = cluster.group(plan.group) if plan.group else cluster.node_groups[0]
    if plan.num_gpus() > g.num_gpus:
        return None
    degrees = (("tp", plan.tp), ("cp", plan.cp), ("dp", plan.dp), ("pp", plan.pp))
    return _symmetric(g.name, cluster.group_offset(g.name), degrees, tuple(plan.order.split("-")))


@lru_cache(maxsize=1024)
def _symmetric(group: str, offset: int, degrees: tuple[tuple[str, int], ...],
               order: tuple[str, ...]) -> Symmetric:
    assert sorted(order) == sorted(AXES)
    return Symmetric(group=group, offset=offset, degrees=degrees, order=order)
