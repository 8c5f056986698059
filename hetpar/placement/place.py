"""``place(model, cluster, plan) -> Mesh``: the plan expanded and its ranks numbered, once.

``place`` lays the plan out with ``specs.expand.expand`` (the most complete placement:
uniform plans in ``plan.order``, explicit replicas with their own devices) and numbers the
used devices in cluster order, as ``hetpar run`` does. ``runtime.layout.build_layout`` is a
view of it, and so are the failure studies' ``failures/layout.py``. The axes are the rows
of ``specs/axes.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hetpar.errors import ConfigError
from hetpar.placement.mesh import Axis, Mesh, RankPlace
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import expand
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

AXIS_RULES: tuple[tuple[str, str, str], ...] = tuple(
    (a.name, a.predicate, a.collective) for a in axes.BUILTIN)
"""(name, predicate, collective) of the device axes: a view of ``specs/axes.py``'s table."""


def placed_plan(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Plan:
    """``place(model, cluster, plan).plan`` without numbering the ranks (the simulator reads
    only the stages' devices): ``expand``'s replicas, and the same errors as ``place``."""
    full = expand(plan, model, cluster)
    seen: set[int] = set()
    for rep in full.replicas:  # the stages place numbers: each replica's first pp
        for st in rep.stages[: full.pp_of(rep)]:
            at = cluster.group_offset(st.group)
            for d in st.devices or ():
                if at + d in seen:
                    used = sorted({cluster.group_offset(s.group) + i for r in full.replicas
                                   for s in r.stages for i in s.devices or ()})
                    raise ConfigError(f"plan: device of rank {used.index(at + d)} is used by "
                                      "two stages")
                seen.add(at + d)
    return full


def place(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Mesh:
    """Lay ``plan`` out on ``cluster``: ranks are the used devices in cluster order.

    Raises Infeasible when the plan does not fit the cluster (``expand``) and ConfigError when
    two stages of an explicit plan claim one device (``placed_plan``).
    """
    full = placed_plan(model, cluster, plan)
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
    plan_axes = axes.plan_degrees(plan)
    # every plan-scope axis at degree 1 (the default space's ep / etp): each rank's
    # coordinate on it is 0 (``_with_coords``' position modulo 1), set as the rank is placed
    ones = tuple((n, 0) for n, d in plan_axes) if all(d == 1 for _, d in plan_axes) else ()
    found: dict[int, RankPlace] = {}
    for ri, (rep, ranks) in enumerate(zip(full.replicas, stage_ranks, strict=True)):
        pp = full.pp_of(rep)
        for p in range(pp):
            st = rep.stages[p]
            chunks = tuple(j for j in range(len(ranks)) if j % pp == p)
            for k, rank in enumerate(ranks[p]):
                assert rank not in found, "placed_plan refuses a device two stages claim"
                assert st.devices is not None
                found[rank] = RankPlace(
                    rank=rank, group=st.group, device=st.devices[k], replica=ri, pp_rank=p,
                    tp_rank=k % st.tp, cp_rank=k // st.tp, tp=st.tp, cp=st.cp, pp=pp,
                    chunks=chunks, coords=ones,
                )
    assert sorted(found) == list(range(len(used)))
    reps = full.replicas
    degree = {
        "tp": max(s.tp for r in reps for s in r.stages),
        "cp": max(s.cp for r in reps for s in r.stages),
        "dp": len(reps),
        "pp": max(full.pp_of(r) for r in reps),
    }
    degree.update(plan_axes)
    found_axes = tuple(Axis(name=a.name, degree=degree[a.name], predicate=a.predicate,
                            collective=a.collective) for a in axes.axes())
    out = Mesh(plan=full, axes=found_axes, ranks=tuple(found[i] for i in range(len(used))),
               stage_ranks=stage_ranks)
    return _with_coords(out, plan_axes) if plan_axes and not ones else out


def _with_coords(mesh: Mesh, plan_axes: Sequence[tuple[str, int]]) -> Mesh:
    """``mesh`` with every rank's coordinate on each plan-scope axis: its position in its
    data-parallel group (replica order) modulo the degree."""
    pos = {r: i for g in mesh.groups("dp") for i, r in enumerate(g)}
    ranks = tuple(replace(p, coords=tuple((n, pos[p.rank] % d) for n, d in plan_axes))
                  for p in mesh.ranks)
    return replace(mesh, ranks=ranks, _memo={})
