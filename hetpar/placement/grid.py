"""The uniform grid view of a placement: devices of a uniform plan by ``device_index``.

``symmetric(plan, cluster)`` is the symmetry shortcut of the simulator's fast path: a uniform
plan whose replicas are identical up to a shift, its devices by the formula ``expand`` lays
the plan out with (``device_index``), memoized here by value, and its groups by name as
``Mesh.groups`` forms them (``Symmetric.members``). ``block_offsets`` lays the planner's replica
classes out by the same formula (``search/structures.py::layout_offsets`` is a view of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product

from hetpar.errors import ConfigError
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import device_index
from hetpar.specs.plan import AXES, Plan

LAYOUTS: dict[str, str] = {"dp-inner": "tp-cp-dp-pp", "pp-inner": "tp-cp-pp-dp"}
"""The planner's names for two device orders (``Plan.order``): ``dp-inner`` (Megatron's
default: a stage's data-parallel peers side by side) and ``pp-inner`` (a replica's pipeline
side by side). ``block_offsets`` lays replica classes out in them."""

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

    def members(self, name: str, **at: int) -> tuple[int, ...]:
        """Devices of the group of ``name`` (device dimensions joined by ``_``, outer first,
        as ``Mesh.groups`` names them) through coordinates ``at`` on the other dimensions
        (0 where not given), in coordinate order: the mesh's group, read off the grid."""
        dims = name.split("_")
        if any(d not in AXES for d in dims) or len(set(dims)) < len(dims):
            raise ConfigError(f"mesh: unknown dimension {name!r}; known: {', '.join(AXES)}")
        deg = dict(self.degrees)
        out = []
        for point in product(*(range(deg[d]) for d in dims)):
            c = {a: at.get(a, 0) for a in AXES} | dict(zip(dims, point, strict=True))
            out.append(device_index(c, deg, list(self.order)))
        return tuple(out)


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
