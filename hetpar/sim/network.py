"""Collective and point-to-point costs on the network levels that a group of devices crosses.

The levels come from the cluster (``Topology``); the algorithms and their costs live in
``hetpar.net.collectives`` (NCCL's ring and tree) and ``hetpar.net.policies`` (hetpar's own:
hierarchical, type-first, split), chosen per communicator by the cluster's ``collectives``
setting. ``GroupShape`` and the cost functions live in ``sim/shapes.py`` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hetpar.catalog import gpu_spec
from hetpar.net import channels
from hetpar.net.busy import LinkId, links, pipeline_flows, send_links
from hetpar.net.collectives import Level, Path
from hetpar.net.topology import NetworkView
from hetpar.sim.netmodel import model_levels, scaled
from hetpar.sim.shapes import (
    LOCAL,
    Device,
    GroupShape,
    all_gather,
    all_reduce,
    all_to_all,
    choices,
    collective,
    p2p,
    record,
    recorded,
    reduce_scatter,
)
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.collectives import NOMINAL, Applied
from hetpar.specs.gpu import GPUSpec

__all__ = ["LOCAL", "Device", "GroupShape", "Path", "Topology", "all_gather", "all_reduce",
           "all_to_all", "choices", "collective", "p2p", "record", "recorded", "reduce_scatter",
           "topology"]


class Topology:
    """Classifies device groups of a cluster onto its network levels.

    The simulator's one hardware boundary: each node group's GPU is resolved here, once (a
    catalog name or file, or a GPUSpec value such as a straggler's slowed GPU), and the
    network and cost terms below read the values.
    """

    def __init__(self, cluster: ClusterSpec, usage: dict[tuple[str, int], int] | None = None,
                 flows: dict[tuple[str, int], int] | None = None,
                 gpus: dict[str, GPUSpec] | None = None, applied: Applied = NOMINAL):
        self.cluster = cluster
        self.applied = applied
        """The plan's collective choices over a network model (``specs/collectives.py``)."""
        self._variants: dict[Applied, Topology] = {}
        if gpus is None:
            gpus = {g.name: gpu_spec(g.gpu) for g in cluster.node_groups}
        self.view = NetworkView(cluster, gpus, usage, flows)
        self.groups = self.view.groups
        self.offsets = self.view.offsets
        self.gpus: dict[str, GPUSpec] = self.view.gpus
        self._cache: dict[tuple[Device, ...], GroupShape] = {}
        self._p2p: dict[tuple[Device, Device], Path] = {}
        self._usage_views: dict[tuple[object, ...], Topology] = {}
        self.placed: dict[tuple[object, ...], object] = {}
        """Explicit plans' placements by stage structure (``sim/placed.py``)."""
        self._busy: dict[int, tuple[GroupShape, frozenset[LinkId]]] = {}
        self._tokens: dict[object, int] = {}
        self._token_ids: dict[int, tuple[object, int]] = {}

    def gpu(self, group: str) -> GPUSpec:
        return self.gpus[group]

    @property
    def shares_nics(self) -> bool:
        """Whether any node group shares one NIC among its GPUs (then usage matters)."""
        return any(g.nic_shared for g in self.cluster.node_groups)

    def with_usage(self, devices: Sequence[Device],
                   stages: Sequence[Sequence[Sequence[Device]]] = ()) -> Topology:
        """This cluster as seen by a plan that uses only ``devices`` and whose replicas have
        chunks on ``stages`` (devices per chunk, pipeline order): a shared NIC is split
        among the GPUs of its node that the plan uses (collectives) or among the pipeline
        sends that leave the node together (p2p), not a fixed 1/gpus_per_node (issue 17)."""
        if not self.shares_nics:
            return self
        usage = self.view.usage_of(devices)
        flows = pipeline_flows(self.view, stages)
        if not usage and not flows:
            return self
        key = (tuple(sorted(usage.items())), tuple(sorted(flows.items())))
        topo = self._usage_views.get(key)
        if topo is None:
            if len(self._usage_views) > 64:
                self._usage_views.clear()
            topo = self._usage_views[key] = Topology(self.cluster, usage, flows, self.gpus,
                                                     self.applied)
        return topo

    def variant(self, applied: Applied) -> Topology:
        """This cluster with ``applied``'s collective choices and network model (cached)."""
        if applied == self.applied:
            return self
        topo = self._variants.get(applied)
        if topo is None:
            topo = self._variants[applied] = Topology(self.cluster, self.view.usage,
                                                      self.view.flows, self.gpus, applied)
        return topo

    def p2p_path(self, a: Device, b: Device) -> Path:
        """The path of one pipeline send from ``a`` to ``b`` (see NetworkView.p2p_path)."""
        key = (a, b)
        hit = self._p2p.get(key)
        if hit is None:
            hit = self._p2p[key] = (scaled(self.view.p2p_path(a, b), self.applied) if a != b
                                    else self.shape([a]).inner)
        return hit

    def shape(self, devices: Sequence[Device]) -> GroupShape:
        """Where the ranks of a communicator over ``devices`` sit (see GroupShape)."""
        key = tuple(devices)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._shape(key)
        return hit

    def _shape(self, devices: Sequence[Device]) -> GroupShape:
        if len(devices) <= 1:
            return LOCAL
        c = self.view.classify(devices)
        app = self.applied
        policy = {"flat": "nccl", "hierarchical": "hierarchical"}.get(app.dp_sync,
                                                                     self.cluster.collectives)
        shape = GroupShape(n=len(devices), k=c.k, inner=c.inner, outer=c.outer,
                           levels=c.levels, alternatives=c.alternatives, inners=c.inners,
                           policy=policy, devices=tuple(devices), library=self.cluster.library,
                           force=(app.algorithm, app.protocol),
                           exclusive=app.dp_sync == "hierarchical"
                           and sum(lv.size > 1 for lv in c.levels) > 1, per_gpu=app.ring_per_gpu)
        arch = min(channels.arch_of(self.gpus[g].compute_capability) for g, _ in devices)
        if arch:  # NCCL's minCompCap picks its per-channel caps (net/channels.py)
            shape = replace(shape, levels=_with_arch(shape.levels, arch), alternatives=tuple(
                _with_arch(a, arch) for a in shape.alternatives))
        if app.scale_out_efficiency == 1.0:
            return shape
        return replace(shape, levels=model_levels(shape.levels, app),
                       alternatives=tuple(model_levels(a, app) for a in shape.alternatives),
                       outer=scaled(shape.outer, app) if shape.outer else None)

    def token(self, value: object) -> int:
        """A small int, equal for equal values: a shape or path in a key that is hashed
        often (``explicit.device_key``) without hashing its levels every time. The same
        object is looked up by identity; a new one once by value."""
        hit = self._token_ids.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        tok = self._tokens.setdefault(value, len(self._tokens))
        self._token_ids[id(value)] = (value, tok)
        return tok

    def busy(self, shape: GroupShape) -> frozenset[LinkId]:
        """The links a communicator keeps busy (``net.busy.links``; a split: every path it
        may use), computed once per shape."""
        hit = self._busy.get(id(shape))
        if hit is None or hit[0] is not shape:
            levels = [lv for alt in (shape.levels, *shape.alternatives) for lv in alt]
            hit = self._busy[id(shape)] = (shape, links(self.view, shape.devices, levels))
        return hit[1]

    def send_busy(self, a: Device, b: Device) -> frozenset[LinkId]:
        """The links one pipeline send from ``a`` to ``b`` keeps busy."""
        return send_links(self.view, a, b, self.p2p_path(a, b)) if a != b else frozenset()


_TOPOLOGIES: dict[int, tuple[ClusterSpec, Topology]] = {}
_BY_VALUE: dict[ClusterSpec, Topology] = {}


def topology(cluster: ClusterSpec) -> Topology:
    """The (cached) Topology of ``cluster``: keyed on the object's identity first, then on
    its value (the replay's planner derives equal clusters as new objects, and each would
    place and classify every group again)."""
    hit = _TOPOLOGIES.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    if len(_TOPOLOGIES) > 256:
        _TOPOLOGIES.clear()
    if len(_BY_VALUE) > 256:
        _BY_VALUE.clear()
    try:
        topo = _BY_VALUE.get(cluster)
    except TypeError:  # a field without a hash (a hand-built spec): by identity only
        topo = Topology(cluster)
    if topo is None:
        topo = _BY_VALUE[cluster] = Topology(cluster)
    _TOPOLOGIES[id(cluster)] = (cluster, topo)
    return topo


def _with_arch(levels: tuple[Level, ...], arch: int) -> tuple[Level, ...]:
    """``levels`` whose paths carry the communicator's compute capability ``arch``."""
    return tuple(Level(lv.size, replace(lv.path, arch=arch)) for lv in levels)
