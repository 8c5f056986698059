"""``ReplicaCost`` answered by the iteration simulator (hetpar.sim) and its collectives."""

from __future__ import annotations

import math
from dataclasses import replace

from hetpar import formulas
from hetpar.errors import Infeasible
from hetpar.failures.layout import Layout
from hetpar.sim import breakdown, simulate, terms
from hetpar.sim import network as net
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


class SimCost:
    """Replica and gradient-sync times from ``hetpar.sim``.

    A replica at TP n with b sequences is the simulator's single-replica report of the plan.
    Below n the simulator cannot split 128 heads over, say, 30 GPUs, but NTP does not split
    them anew: the n shards of every weight stay and the t survivors hold n / t of them each
    (Arfeen et al. 2025, Sec. 4.2). So the report's per-GPU work at TP n is scaled: compute,
    recompute, pipeline sends and the optimizer by n / t (compute also by 1 / speed), TP
    collectives by the ring factor (t-1)/t over (n-1)/n, the pipeline bubble by the ratio of
    busy time, the per-iteration overhead not at all.

    Gradient sync: the simulator's exposed DP time for R healthy replicas, plus the extra of
    a mixed-degree iteration computed with the simulator's collectives: the all-reduce over the
    matching ranks with the larger payload (stage / min degree instead of stage / n) and the
    reshard of the n - t extra shards inside the scale-up domain before and after it. The
    extra is taken as fully exposed (the healthy sync already used the overlap window).
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, lay: Layout) -> None:
        self.model, self.cluster, self.plan, self.lay = model, cluster, plan, lay
        self.topo = net.Topology(cluster)
        self.grad_bytes = terms.element_bytes(plan.precision)
        g = cluster.group(lay.group)
        self.inner = self.topo.shape([(g.name, i) for i in range(lay.tp)]).inner
        # plain dicts, not lru_cache: the cost (caches included) is pickled to --workers
        self._reports: dict[tuple[int, int], dict[str, float] | None] = {}
        self._syncs: dict[int, float] = {}

    def _report(self, batch: int, dp: int) -> dict[str, float] | None:
        if (batch, dp) not in self._reports:
            self._reports[batch, dp] = self._simulate(batch, dp)
        return self._reports[batch, dp]

    def _healthy_sync(self, replicas: int) -> float:
        if replicas not in self._syncs:
            self._syncs[replicas] = self._exposed_sync(replicas)
        return self._syncs[replicas]

    def _simulate(self, batch: int, dp: int) -> dict[str, float] | None:
        """The report's breakdown, iteration time and the fullest GPU's memory share of the
        plan with ``dp`` replicas of ``batch``; None if the simulator finds it infeasible
        (e.g. a schedule that cannot run that many micro-batches)."""
        p = replace(self.plan, dp=dp, global_batch=batch * dp)
        try:
            r = simulate(self.model, self.cluster, p)
        except Infeasible:
            return None
        # parameters, gradients, optimizer state and activations per GPU all scale with n / t
        fill = max(((m.total - m.other) / (m.capacity - m.other) for m in r.memory), default=0.0)
        return dict(r.breakdown) | {"iteration": r.iteration_time_s, "fill": fill}

    def replica_time(self, tp: int, batch: int, speed: float = 1.0) -> float:
        """Seconds, or infinity if the share cannot run (infeasible, or out of memory once
        the t survivors hold n / t of the n shards)."""
        b = self._report(batch, 1)
        n = self.lay.tp
        work = n / tp
        if b is None or b["fill"] * work > 1.0:
            return math.inf
        ring = terms.ring_traffic("reduce_scatter", tp) / terms.ring_traffic("reduce_scatter", n) \
            if n > 1 else 1.0
        return rescaled(b, {"share": work, "speed": speed, "tp_ring": ring})

    def _fit(self, replicas: int) -> int:
        """Replicas the node group can hold (spares beyond it are costed as the largest)."""
        width = self.lay.tp * self.lay.units_per_replica
        return max(1, min(replicas, self.cluster.group(self.lay.group).num_gpus // width))

    def _exposed_sync(self, replicas: int) -> float:
        if replicas <= 1:
            return 0.0
        b = self._report(self.lay.batch_per_replica, self._fit(replicas))
        if b is None:
            raise Infeasible("plan", f"the plan with {replicas} replicas does not simulate")
        return sum((b.get(t.key, 0.0) for t in breakdown.terms() if t.scales == "sync"), 0.0)

    def _dp_shape(self, replicas: int) -> net.GroupShape:
        stride = self.lay.tp * self.lay.units_per_replica
        return self.topo.shape([(self.lay.group, i * stride) for i in range(self._fit(replicas))])

    def sync_time(self, degrees: frozenset[int], replicas: int) -> float:
        base = self._healthy_sync(replicas)
        n, t_min = self.lay.tp, min(degrees)
        if t_min == n or replicas <= 1:
            return base
        layers = -(-self.model.n_layers // self.lay.pp)
        stage = formulas.layers_params(self.model, 0, layers) * self.grad_bytes
        shape = self._dp_shape(replicas)
        extra = net.all_reduce(shape, stage / t_min) - net.all_reduce(shape, stage / n)
        if len(degrees) > 1:  # replicas of different degree reshard to the smallest
            extra += 2 * net.p2p(self.inner, stage / n)
        return base + extra


def rescaled(b: dict[str, float], factor: dict[str, float]) -> float:
    """A replica's time from its breakdown ``b`` with each term scaled as its registered
    ``Term.scales`` says (``sim.breakdown``): per-micro-batch terms by ``factor`` of their
    kind (``share``: n / t, ``speed``: the GPU's relative speed, ``tp_ring``; ``fixed``: 1),
    the bubble with the busy time they make up, per-iteration terms
    likewise; the data-parallel sync (``sync``) is not a replica's (``sync_time``)."""
    ts = breakdown.terms()
    busy, groups = 0.0, dict[str, float]()
    for t in ts:
        if t.per == "micro_batch":
            busy += b.get(t.key, 0.0)
            groups[t.scales] = groups.get(t.scales, 0.0) + b.get(t.key, 0.0)
    new_busy = 0.0
    for scales, v in groups.items():  # summed per kind first: the terms share one factor
        new_busy += _scale(v, scales, factor)
    ratio = new_busy / busy if busy > 0 else 1.0
    total = new_busy
    for t in ts:
        if t.per == "iteration" and t.scales == "busy":
            total += b.get(t.key, 0.0) * ratio
    for t in ts:
        if t.per == "iteration" and t.scales not in ("busy", "sync"):
            total += _scale(b.get(t.key, 0.0), t.scales, factor)
    return total


def _scale(v: float, scales: str, factor: dict[str, float]) -> float:
    if scales == "compute":  # the share of the work, on a GPU of relative speed
        return v * factor["share"] / factor["speed"]
    return v if scales == "fixed" else v * factor[scales]
