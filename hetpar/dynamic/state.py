"""Cluster state over time: a trace's events applied to a ClusterSpec, as a new ClusterSpec."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hetpar.catalog import gpu_spec
from hetpar.dynamic.paths import NodeCondition, derive_group, slowed_gpu
from hetpar.dynamic.trace import Trace, TraceEvent
from hetpar.errors import ConfigError, Infeasible
from hetpar.specs.cluster import ClusterSpec, Link, NodeGroup
from hetpar.specs.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Part:
    """Present nodes ``[first_node, first_node + num_nodes)`` of one original node group that
    share a condition; it is one node group (named ``name``) of the derived ClusterSpec."""

    name: str
    group: str
    first_node: int
    num_nodes: int
    gpus_per_node: int


@dataclass(frozen=True, kw_only=True)
class ClusterState:
    """The cluster at time ``t_s``: what the simulator sees, and where each device went."""

    t_s: float
    cluster: ClusterSpec | None
    """None when no node is left."""
    parts: tuple[Part, ...]

    def part(self, name: str) -> Part:
        """The part that is node group ``name`` of the derived cluster."""
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(name)

    def identity(self, part: str, device: int) -> tuple[str, int]:
        """(original group, device index in it) of device ``device`` of derived group ``part``."""
        p = self.part(part)
        return p.group, p.first_node * p.gpus_per_node + device

    def locate(self, group: str, device: int) -> tuple[str, int] | None:
        """(derived group, device index in it) of an original device, or None if it is gone."""
        for p in self.parts:
            start = p.first_node * p.gpus_per_node
            if p.group == group and start <= device < start + p.num_nodes * p.gpus_per_node:
                return p.name, device - start
        return None


@dataclass(frozen=True, kw_only=True)
class Step:
    """The state from ``t_s`` until the next step, and the events that made it."""

    t_s: float
    state: ClusterState
    events: tuple[TraceEvent, ...]


class Conditions:
    """Mutable per-node, per-link and per-tier conditions, changed one event at a time."""

    def __init__(self, base: ClusterSpec) -> None:
        self.base = base
        self.nodes: dict[str, list[NodeCondition]] = {}
        self.present: dict[str, int] = {}
        for g in base.node_groups:
            nv = g.scaleup_bandwidth_gbps or gpu_spec(g.gpu).scaleup_bandwidth_gbps
            cond = NodeCondition(nvlink_gbps=nv, pcie_gbps=g.node_bandwidth_gbps,
                                 nic_gbps=g.nic_bandwidth_gbps)
            self.nodes[g.name] = [cond] * g.num_nodes
            self.present[g.name] = g.num_nodes
        self.tiers = {t.name: t.bandwidth_gbps for t in base.tiers}
        self.links = {(lk.a, lk.b): (lk.bandwidth_gbps, True) for lk in base.links}

    def apply(self, ev: TraceEvent, where: str) -> None:
        """Apply one event; ConfigError naming ``where`` (file:line) if it does not fit."""
        loc = f"{where}:{ev.line}"
        if ev.prefix == "tier":
            tier = {t.name: t for t in self.base.tiers}.get(ev.name)
            if tier is None:
                known = _known(t.name for t in self.base.tiers)
                raise ConfigError(f"{loc}: unknown tier {ev.name!r}; known: {known}")
            self.tiers[ev.name] = _new_bandwidth(ev, tier.bandwidth_gbps)
        elif ev.prefix == "link":
            self._apply_link(ev, loc)
        elif ev.prefix == "group":
            self._apply_group(ev, loc)
        else:
            self._apply_path(ev, loc)

    def _group(self, name: str, loc: str) -> NodeGroup:
        for g in self.base.node_groups:
            if g.name == name:
                return g
        raise ConfigError(f"{loc}: unknown node group {name!r}; known: {_known(self.nodes)}")

    def _apply_link(self, ev: TraceEvent, loc: str) -> None:
        a, _, b = ev.name.partition("/")
        key = (a, b) if (a, b) in self.links else (b, a)
        if key not in self.links:
            known = _known(f"{x}/{y}" for x, y in self.links)
            raise ConfigError(f"{loc}: unknown link {ev.name!r}; known: {known}")
        bw, up = self.links[key]
        if ev.kind in ("down", "up"):
            self.links[key] = (bw, ev.kind == "up")
        else:
            base = next(lk.bandwidth_gbps for lk in self.base.links if (lk.a, lk.b) == key)
            self.links[key] = (_new_bandwidth(ev, base), up)

    def _selected(self, ev: TraceEvent, loc: str) -> list[int]:
        g = self._group(ev.name, loc)
        if ev.node is None:
            return list(range(g.num_nodes))
        if ev.node >= g.num_nodes:
            raise ConfigError(
                f"{loc}: node {ev.node} outside group {g.name!r} (0..{g.num_nodes - 1})")
        return [ev.node]

    def _apply_path(self, ev: TraceEvent, loc: str) -> None:
        g = self._group(ev.name, loc)
        if ev.prefix == "pcie" and g.node_bandwidth_gbps is None:
            raise ConfigError(
                f"{loc}: group {g.name!r} has no pcie path (its node_bandwidth_gbps is unset)"
            )
        base = NodeCondition(
            nvlink_gbps=g.scaleup_bandwidth_gbps or gpu_spec(g.gpu).scaleup_bandwidth_gbps,
            pcie_gbps=g.node_bandwidth_gbps, nic_gbps=g.nic_bandwidth_gbps,
        )
        nodes = self.nodes[g.name]
        for i in self._selected(ev, loc):
            c = nodes[i]
            if ev.kind in ("down", "up"):
                nodes[i] = dataclasses.replace(c, **{f"{ev.prefix}_up": ev.kind == "up"})
            else:
                key = f"{ev.prefix}_gbps"
                bw: dict[str, float] = {key: _new_bandwidth(ev, getattr(base, key))}
                nodes[i] = dataclasses.replace(c, **bw)  # type: ignore[arg-type]

    def _apply_group(self, ev: TraceEvent, loc: str) -> None:
        g = self._group(ev.name, loc)
        have = self.present[g.name]
        if ev.kind == "slowdown":
            nodes = self.nodes[g.name]
            for i in self._selected(ev, loc):
                nodes[i] = dataclasses.replace(nodes[i], slowdown=float(ev.value or 1.0))
            return
        if ev.node is not None:
            raise ConfigError(f"{loc}: {ev.kind} takes 'nodes' (a count), not 'node'")
        room = have if ev.kind == "leave" else g.num_nodes - have
        k = room if ev.nodes is None else ev.nodes
        if k > room or k == 0:
            what = "present" if ev.kind == "leave" else "absent"
            raise ConfigError(
                f"{loc}: {ev.kind} {k} nodes of group {g.name!r}, but {room} are {what}"
            )
        # Nodes leave from the end and rejoin in order, so present nodes are always a prefix.
        self.present[g.name] = have - k if ev.kind == "leave" else have + k

    def state(self, t_s: float) -> ClusterState:
        """The derived ClusterSpec and device map for the current conditions."""
        groups: list[NodeGroup] = []
        parts: list[Part] = []
        for g in self.base.node_groups:
            for first, n, cond in _runs(self.nodes[g.name][: self.present[g.name]]):
                name = g.name if first == 0 else f"{g.name}@{first}"
                gpu = g.gpu if cond.slowdown == 1 else slowed_gpu(gpu_spec(g.gpu), cond.slowdown)
                groups.append(derive_group(g, name=name, num_nodes=n, cond=cond, gpu=gpu))
                parts.append(Part(name=name, group=g.name, first_node=first, num_nodes=n,
                                  gpus_per_node=g.gpus_per_node))
        if not groups:
            return ClusterState(t_s=t_s, cluster=None, parts=())
        total = sum(x.num_gpus for x in groups)
        tiers = tuple(
            dataclasses.replace(t, bandwidth_gbps=self.tiers[t.name],
                                size_gpus=t.size_gpus if t.size_gpus < total else 0)
            for t in self.base.tiers
        )
        links = tuple(
            Link(a=pa.name, b=pb.name, bandwidth_gbps=bw, latency_us=lk.latency_us,
                 a_nodes=an, b_nodes=bn, kind=lk.kind)
            for lk in self.base.links
            for bw, up in [self.links[(lk.a, lk.b)]] if up
            for pa in parts if pa.group == lk.a
            for pb in parts if pb.group == lk.b
            # a link between specific nodes follows them into the part that holds them
            for an, bn in [(_part_nodes(lk.a_nodes, pa), _part_nodes(lk.b_nodes, pb))]
            if an is not None and bn is not None and (pa.name != pb.name or (an and bn))
        )
        cluster = dataclasses.replace(self.base, node_groups=tuple(groups), tiers=tiers,
                                      links=links)
        return ClusterState(t_s=t_s, cluster=cluster, parts=tuple(parts))


def _known(names: object) -> str:
    return ", ".join(str(n) for n in names) or "(none)"  # type: ignore[attr-defined]


def _new_bandwidth(ev: TraceEvent, base: float | None) -> float:
    assert ev.value is not None and base is not None
    return ev.value if ev.kind == "bandwidth" else base * ev.value


def _runs(conds: list[NodeCondition]) -> list[tuple[int, int, NodeCondition]]:
    """Maximal runs of consecutive nodes with equal conditions: (first, count, condition)."""
    out: list[tuple[int, int, NodeCondition]] = []
    for i, c in enumerate(conds):
        if out and out[-1][2] == c:
            first, n, _ = out[-1]
            out[-1] = (first, n + 1, c)
        else:
            out.append((i, 1, c))
    return out


def timeline(base: ClusterSpec, trace: Trace) -> list[Step]:
    """The cluster's states: one Step at t=0 and one at each later time with events.

    Raises ConfigError naming the trace line of the first event that does not fit ``base``.
    """
    cond = Conditions(base)
    steps: list[Step] = []
    events = list(trace.events)
    times = sorted({0.0, *(e.t_s for e in events)})
    i = 0
    for t in times:
        now = []
        while i < len(events) and events[i].t_s == t:
            cond.apply(events[i], trace.path or trace.name)
            now.append(events[i])
            i += 1
        steps.append(Step(t_s=t, state=cond.state(t), events=tuple(now)))
    return steps


def relocate(plan: Plan, old: ClusterState, new: ClusterState) -> Plan:
    """``plan`` (explicit, devices assigned, in ``old``'s group names) in ``new``'s names.

    Devices keep their physical identity; Infeasible if one of them has left or a stage's
    devices now sit in two derived groups (e.g. a straggler node split its TP group).
    """
    if old.parts == new.parts:
        return plan
    replicas = []
    for r in plan.replicas:
        stages = []
        for s in r.stages:
            assert s.devices is not None, "relocate needs an expanded plan"
            where = [new.locate(*old.identity(s.group, d)) for d in s.devices]
            if any(w is None for w in where):
                raise Infeasible("devices", f"a device of node group {base_of(s.group)!r} has left")
            names = {w[0] for w in where if w is not None}
            if len(names) > 1:
                raise Infeasible("placement", f"a stage now spans node groups {sorted(names)}")
            stages.append(dataclasses.replace(
                s, group=names.pop(), devices=tuple(w[1] for w in where if w is not None)))
        replicas.append(dataclasses.replace(r, stages=tuple(stages)))
    return dataclasses.replace(plan, replicas=tuple(replicas))


def base_of(part_name: str) -> str:
    """The original node group of a derived group name (``a100@6`` -> ``a100``)."""
    return part_name.split("@", 1)[0]


def _part_nodes(nodes: tuple[int, ...], part: Part) -> tuple[int, ...] | None:
    """A link's node indices inside ``part`` (empty: all nodes), or None when none is in it."""
    if not nodes:
        return ()
    local = tuple(n - part.first_node for n in nodes
                  if part.first_node <= n < part.first_node + part.num_nodes)
    return local or None
