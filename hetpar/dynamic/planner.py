"""Best plan for a cluster state, warm-started from the current plan: the interface and a
small planner over per-group shapes scored by any ThroughputModel.

The plans are "split" plans (one of the planner families in hetpar.search): each node
group runs identical replicas of its own TP x PP shape (layers split evenly), replicas get
batch shares that equalise their iteration times as the throughput model sees them
(dynamic/balance.py; HetPipe/Whale-style heterogeneous data parallelism), and all
replicas join one gradient all-reduce. The search is coordinate descent over groups:
change one group's shape (or drop the group) at a time, keep what helps. A warm start
begins from the current plan's shapes, so one or two sweeps suffice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from hetpar.dynamic.balance import Line, line_from_probes, shares
from hetpar.dynamic.cost import ThroughputModel
from hetpar.dynamic.state import ClusterState, Part, base_of
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage, split_layers


class Planner(Protocol):
    """The best plan for ``state`` (None if nothing fits), starting the search from ``warm``."""

    def best(self, state: ClusterState, warm: Plan | None = None) -> Plan | None: ...


@dataclass(frozen=True)
class Shape:
    """TP x PP of the replicas of one node group."""

    tp: int
    pp: int


Layout = tuple[Shape | None, ...]
"""One shape (or None: unused) per part of the state, in the state's order."""


class ShapePlanner:
    """Coordinate descent over per-group shapes, scored by ``cost``."""

    def __init__(self, model: ModelSpec, job: Job, cost: ThroughputModel, *,
                 tp: tuple[int, ...] = (1, 2, 4, 8), pp: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
                 micro_batch: int = 1) -> None:
        if job.global_batch % micro_batch:
            micro_batch = 1
        self.model, self.job, self.cost = model, job, cost
        self.tps, self.pps, self.micro_batch = tp, pp, micro_batch
        self.evaluations = 0
        self._replicas: dict[tuple[Part, Shape, int, int], Replica] = {}
        self._lines: dict[tuple[ClusterSpec, Part, Shape], Line | None] = {}

    def shapes(self, part: Part) -> list[Shape]:
        """Shapes that divide the group: TP inside a node, at most one stage per layer."""
        gpus = part.num_nodes * part.gpus_per_node
        return [Shape(t, p) for t in self.tps for p in self.pps
                if part.gpus_per_node % t == 0 and t * p <= gpus and p <= self.model.n_layers]

    def best(self, state: ClusterState, warm: Plan | None = None) -> Plan | None:
        """Best plan found; warm-started from ``warm``'s shapes when given."""
        if state.cluster is None:
            return None
        warm_start = self._warm_layout(state, warm) if warm is not None else None
        start = warm_start if warm_start is not None else self._cold_layout(state)
        n = len(state.parts)
        # Groups are coupled through the all-reduce, so descent from one start can stall:
        # also start from each group alone (descent cannot drop one group and add another
        # in one move) and from every group on one common shape (Megatron-like plans).
        starts = [start] + [_only(n, i, s) for i, s in enumerate(start) if s is not None]
        common = set.intersection(*(set(self.shapes(p)) for p in state.parts))
        starts += [tuple([s] * n) for s in sorted(common, key=lambda x: (x.tp, x.pp))]
        scored = [(self.score(state, x), i) for i, x in enumerate(starts)]
        start = starts[max(scored)[1]]
        local = start if warm_start is not None else None
        layout, score = self._descend(state, start, sweeps=3, local=local)
        return self.plan(state, layout) if score > 0 else None

    def score(self, state: ClusterState, layout: Layout) -> float:
        """Tokens/s of ``layout`` on ``state`` (0 if it has no replica or does not fit)."""
        plan = self.plan(state, layout)
        if plan is None:
            return 0.0
        self.evaluations += 1
        return self.cost.tokens_per_s(plan, state)

    def _cold_layout(self, state: ClusterState) -> Layout:
        """Each group with the shape that is fastest when the group trains alone."""
        n = len(state.parts)
        out: list[Shape | None] = []
        for i, part in enumerate(state.parts):
            scored = [(self.score(state, _only(n, i, s)), s) for s in self.shapes(part)]
            best = max(scored, key=lambda x: x[0], default=(0.0, None))
            out.append(best[1] if best[0] > 0 else None)
        return tuple(out)

    def _warm_layout(self, state: ClusterState, warm: Plan) -> Layout | None:
        """The warm plan's shape per original group, applied to that group's parts now."""
        shapes: dict[str, Shape] = {}
        for r in warm.replicas:
            s = r.stages[0]
            if len({x.group for x in r.stages}) == 1:
                shapes.setdefault(base_of(s.group), Shape(s.tp, len(r.stages)))
        if not shapes:
            return None
        return tuple(shapes.get(p.group) if shapes.get(p.group) in self.shapes(p) else None
                     for p in state.parts)

    def _options(self, part: Part, around: Shape | None) -> list[Shape | None]:
        """All shapes of ``part``, or (warm start) those within a factor 2 in TP and PP."""
        shapes = self.shapes(part)
        if around is not None:
            shapes = [s for s in shapes if around.tp // 2 <= s.tp <= around.tp * 2
                      and around.pp // 2 <= s.pp <= around.pp * 2]
        return [None, *shapes]

    def _descend(self, state: ClusterState, layout: Layout, sweeps: int,
                 local: Layout | None = None) -> tuple[Layout, float]:
        """Change one group's shape at a time while that helps (``local``: near it only)."""
        best = self.score(state, layout)
        for _ in range(sweeps):
            improved = False
            for i, part in enumerate(state.parts):
                for option in self._options(part, local[i] if local else None):
                    if option == layout[i]:
                        continue
                    cand = (*layout[:i], option, *layout[i + 1:])
                    s = self.score(state, cand)
                    if s > best * (1 + 1e-9):
                        layout, best, improved = cand, s, True
            # Groups are coupled through the gradient all-reduce (its slowest member sets
            # its time), so also move every group's shape at once.
            for joint in _joint_moves(layout):
                if all(s is None or s in self.shapes(p)
                       for p, s in zip(state.parts, joint, strict=True)):
                    s = self.score(state, joint)
                    if s > best * (1 + 1e-9):
                        layout, best, improved = joint, s, True
            if not improved:
                break
        return layout, best

    def plan(self, state: ClusterState, layout: Layout) -> Plan | None:
        """The explicit plan of ``layout``: replicas, devices and batch shares."""
        slots: list[tuple[Part, Shape, int]] = []  # (part, shape, replica index)
        for part, shape in zip(state.parts, layout, strict=True):
            if shape is not None:
                n = part.num_nodes * part.gpus_per_node // (shape.tp * shape.pp)
                slots += [(part, shape, k) for k in range(n)]
        shares = self._shares(state, slots)
        if shares is None:
            return None
        replicas = [self._replica(part, shape, k, mbs)
                    for (part, shape, k), mbs in zip(slots, shares, strict=True)]
        return Plan(name=layout_name(state, layout), replicas=tuple(replicas),
                    micro_batch=self.micro_batch, precision=self.job.precision, zero=1,
                    sequence_parallel=True)

    def _replica(self, part: Part, shape: Shape, k: int, mbs: int) -> Replica:
        """Replica ``k`` of ``shape`` on ``part`` with ``mbs`` micro-batches (memoized)."""
        key = (part, shape, k, mbs)
        if key not in self._replicas:
            if len(self._replicas) > 200_000:
                self._replicas.clear()
            base = k * shape.tp * shape.pp
            stages = tuple(
                Stage(layers=rng, group=part.name, tp=shape.tp,
                      devices=tuple(range(base + j * shape.tp, base + (j + 1) * shape.tp)))
                for j, rng in enumerate(split_layers(self.model.n_layers, shape.pp))
            )
            self._replicas[key] = Replica(stages=stages, batch=mbs * self.micro_batch,
                                          micro_batch=self.micro_batch)
        return self._replicas[key]

    def _shares(self, state: ClusterState,
                slots: list[tuple[Part, Shape, int]]) -> list[int] | None:
        """Micro-batches per replica equalising their iteration times (balance.shares)."""
        total = self.job.global_batch // self.micro_batch
        if not slots or len(slots) > total:
            return None
        # One line per (group, shape), not per replica: a 1,024-GPU layout has hundreds.
        per_shape = {(p, s): self._line(state, p, s) for p, s in {(p, s) for p, s, _ in slots}}
        lines = [per_shape[(part, shape)] for part, shape, _ in slots]
        if any(x is None for x in lines):
            return None  # a replica of that shape cannot run on its own
        return shares([x for x in lines if x is not None], total)

    def _line(self, state: ClusterState, part: Part, shape: Shape) -> Line | None:
        """(c, tau) of a replica of ``shape`` on ``part``: two probe runs of the group alone,
        every replica with the same micro-batches (so ZeRO shards over the group's replicas
        as in the full plan, and the group's own gradient sync is in ``c``)."""
        assert state.cluster is not None
        # The probe sees only its own group (and the tiers), so the cache survives changes
        # elsewhere: an inter-zone link or another group's nodes leaving reuse every line.
        sub = _alone(state.cluster, part.name)
        key = (sub, part, shape)
        if key not in self._lines:
            if len(self._lines) > 20_000:
                self._lines.clear()
            alone = ClusterState(t_s=state.t_s, cluster=sub, parts=(part,))
            count = part.num_nodes * part.gpus_per_node // (shape.tp * shape.pp)
            probes = []
            for m in (shape.pp, 2 * shape.pp):
                plan = Plan(name="probe",
                            replicas=tuple(self._replica(part, shape, k, m) for k in range(count)),
                            micro_batch=self.micro_batch, precision=self.job.precision, zero=1,
                            sequence_parallel=True)
                tps = self.cost.tokens_per_s(plan, alone)
                tokens = count * m * self.micro_batch * (self.job.seq_len or self.model.seq_len)
                probes.append((m, tokens / tps if tps > 0 else 0.0))
            (m1, t1), (m2, t2) = probes
            self._lines[key] = line_from_probes(m1, t1, m2, t2)
        return self._lines[key]


def _alone(cluster: ClusterSpec, group: str) -> ClusterSpec:
    """``cluster`` with only node group ``group``; the first tier that holds the whole group
    becomes the top tier (traffic inside the group never reaches the larger ones)."""
    g = cluster.group(group)
    tiers = []
    for t in cluster.tiers:
        if t.size_gpus and t.size_gpus < g.num_gpus:
            tiers.append(t)
        else:
            tiers.append(dataclasses.replace(t, size_gpus=0))
            break
    return dataclasses.replace(cluster, node_groups=(g,), links=(), tiers=tuple(tiers))


def _joint_moves(layout: Layout) -> list[Layout]:
    """``layout`` with every group's TP or PP doubled or halved together."""
    out = []
    for ft, fp in ((2, 1), (1, 2), (0.5, 1), (1, 0.5), (2, 0.5), (0.5, 2)):
        out.append(tuple(None if s is None else Shape(int(s.tp * ft), int(s.pp * fp))
                         for s in layout))
    return [x for x in out if x != layout]


def _only(n: int, i: int, shape: Shape) -> Layout:
    return tuple(shape if j == i else None for j in range(n))


def layout_name(state: ClusterState, layout: Layout) -> str:
    """Short plan name, e.g. ``h100:tp4pp2x16+a100:tp2pp4x8``."""
    parts = []
    for part, s in zip(state.parts, layout, strict=True):
        if s is not None:
            n = part.num_nodes * part.gpus_per_node // (s.tp * s.pp)
            parts.append(f"{part.name}:tp{s.tp}pp{s.pp}x{n}")
    return "+".join(parts) or "(empty)"
