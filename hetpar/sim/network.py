"""Collective and point-to-point costs on the network tier that a group of devices crosses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetpar.catalog import load_gpu
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.gpu import GPUSpec

Device = tuple[str, int]
"""(node group name, device index inside the group)."""


@dataclass(frozen=True, slots=True)
class Path:
    """One level of the network as seen by one GPU: achieved bytes/s per direction, latency."""

    scope: str
    bandwidth: float
    latency: float


@dataclass(frozen=True, slots=True)
class GroupShape:
    """How a communicator's ``n`` ranks sit on the network.

    ``k`` ranks share each inner domain (scale-up domain, or node when it is larger); ``outer``
    joins the ``n / k`` domains (None when all ranks are in one domain).
    """

    n: int
    k: int
    inner: Path
    outer: Path | None

    @property
    def scope(self) -> str:
        return self.outer.scope if self.outer else self.inner.scope


LOCAL = GroupShape(n=1, k=1, inner=Path("local", math.inf, 0.0), outer=None)


def _ring_latency(steps: int, n: int, latency: float) -> float:
    # NCCL switches from rings to trees when latency dominates: 2 log2(n) hops instead of
    # 2(n-1) (Sanders et al. 2009 double binary trees, used by NCCL >= 2.4).
    tree = 2 * math.ceil(math.log2(n)) if n > 1 else 0
    return latency * min(steps, tree) if steps else 0.0


def all_reduce(shape: GroupShape, nbytes: float) -> float:
    """Seconds for an all-reduce of ``nbytes`` per rank.

    Inside one domain: ring, 2(n-1)/n x bytes / bandwidth (Patarasuk & Yuan 2009). Across
    domains: hierarchical, i.e. reduce-scatter inside, all-reduce of 1/k of the data across the
    n/k domains on each rank's own NIC share, all-gather inside (Jia et al. 2018; equal to what
    NCCL's multi-channel rings achieve when every GPU has its NIC).
    """
    return 2 * _half(shape, nbytes)


def reduce_scatter(shape: GroupShape, nbytes: float) -> float:
    """Seconds for a reduce-scatter of ``nbytes`` (the full, unsharded size) per rank."""
    return _half(shape, nbytes)


all_gather = reduce_scatter
"""An all-gather moves the same bytes as a reduce-scatter (``nbytes`` = gathered size)."""


def _half(shape: GroupShape, nbytes: float) -> float:
    n, k = shape.n, shape.k
    if n <= 1 or nbytes <= 0:
        return 0.0
    inn = shape.inner
    t = (k - 1) / k * nbytes / inn.bandwidth + _ring_latency(k - 1, k, inn.latency)
    if shape.outer is not None:
        m = n // k
        out = shape.outer
        t += (m - 1) / m * nbytes / k / out.bandwidth + _ring_latency(m - 1, m, out.latency)
    return t


def p2p(path: Path, nbytes: float) -> float:
    """Seconds to send ``nbytes`` from one GPU to another over ``path``."""
    if nbytes <= 0 or path.bandwidth == math.inf:
        return 0.0
    return path.latency + nbytes / path.bandwidth


class Topology:
    """Classifies device groups of a cluster onto its network levels."""

    def __init__(self, cluster: ClusterSpec, efficiency: float | None = None) -> None:
        if efficiency is None:
            from hetpar.sim.profile import resolve

            efficiency = resolve().net_efficiency
        self.cluster = cluster
        self.efficiency = efficiency
        """Achieved share of line rate by NCCL collectives (the framework profile's)."""
        self.groups = {g.name: g for g in cluster.node_groups}
        self.offsets = {g.name: cluster.group_offset(g.name) for g in cluster.node_groups}
        self.gpus: dict[str, GPUSpec] = {g.name: load_gpu(g.gpu) for g in cluster.node_groups}
        self._inner = {g.name: self._inner_path(g) for g in cluster.node_groups}
        self._node = {g.name: self._node_path(g) for g in cluster.node_groups}
        self._cache: dict[tuple[Device, ...], GroupShape] = {}

    def gpu(self, group: str) -> GPUSpec:
        return self.gpus[group]

    def _inner_path(self, g: NodeGroup) -> Path:
        gbps = g.scaleup_bandwidth_gbps or self.gpus[g.name].scaleup_bandwidth_gbps
        return Path("scale-up", gbps * 1e9 / 8 * self.efficiency, g.scaleup_latency_us * 1e-6)

    def _node_path(self, g: NodeGroup) -> Path:
        inner = self._inner[g.name]
        if g.node_bandwidth_gbps is None:
            return Path("node", inner.bandwidth, inner.latency)
        bw = g.node_bandwidth_gbps * 1e9 / 8 * self.efficiency
        return Path("node", bw, inner.latency)

    def shape(self, devices: Sequence[Device]) -> GroupShape:
        """Where the ranks of a communicator over ``devices`` sit (see GroupShape)."""
        key = tuple(devices)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._shape(key)
        return hit

    def _shape(self, devices: Sequence[Device]) -> GroupShape:
        n = len(devices)
        if n <= 1:
            return LOCAL
        names = {d[0] for d in devices}
        if len(names) == 1:
            return self._shape_one_group(self.groups[devices[0][0]], [d[1] for d in devices])
        inner = min((self._inner[x] for x in names), key=lambda p: p.bandwidth)
        per_dom: dict[tuple[str, int], int] = {}
        for name, i in devices:
            key = (name, i // self.groups[name].domain_size)
            per_dom[key] = per_dom.get(key, 0) + 1
        k = min(per_dom.values())
        k = k if n % k == 0 else 1
        return GroupShape(n=n, k=k, inner=inner, outer=self._outer(devices, names))

    def _shape_one_group(self, g: NodeGroup, idx: Sequence[int]) -> GroupShape:
        n, dom = len(idx), g.domain_size
        lo, hi = min(idx), max(idx)
        inner = self._inner[g.name]
        if lo // dom == hi // dom:
            return GroupShape(n=n, k=n, inner=inner, outer=None)
        per: dict[int, int] = {}
        for i in idx:
            per[i // dom] = per.get(i // dom, 0) + 1
        k = min(per.values())
        k = k if n % k == 0 and max(per.values()) == k else 1
        node = max(g.gpus_per_node, dom)
        if lo // node == hi // node:
            return GroupShape(n=n, k=k, inner=inner, outer=self._node[g.name])
        off = self.offsets[g.name]
        return GroupShape(n=n, k=k, inner=inner, outer=self._scaleout([g], off + lo, off + hi))

    def _outer(self, devices: Sequence[Device], names: set[str]) -> Path:
        groups = [self.groups[x] for x in names]
        links = [lk for lk in self.cluster.links if {lk.a, lk.b} <= names and lk.a != lk.b]
        base = self._scaleout(
            groups,
            min(self.offsets[x] + i for x, i in devices),
            max(self.offsets[x] + i for x, i in devices),
            wan=len({g.zone for g in groups}) > 1,
        )
        for lk in links:
            bw = lk.bandwidth_gbps * 1e9 / 8 * self.efficiency
            if bw < base.bandwidth:
                base = Path(f"link {lk.a}-{lk.b}", bw, lk.latency_us * 1e-6)
        return base

    def _scaleout(
        self, groups: Sequence[NodeGroup], lo: int, hi: int, *, wan: bool = False
    ) -> Path:
        """The NIC share plus the smallest tier instance holding global devices lo..hi."""
        nic = min(g.nic_bandwidth_gbps for g in groups) * 1e9 / 8 * self.efficiency
        lat = max(g.nic_latency_us for g in groups) * 1e-6
        total = self.cluster.num_gpus
        for tier in self.cluster.tiers:
            if wan and tier.kind != "wan":
                continue
            size = tier.size_gpus or total
            if lo // size == hi // size or tier is self.cluster.tiers[-1]:
                bw = tier.bandwidth_gbps * 1e9 / 8 * self.efficiency / tier.oversubscription
                return Path(tier.name, min(nic, bw), lat + tier.latency_us * 1e-6)
        return Path("network", nic, lat)


_TOPOLOGIES: dict[tuple[int, float], Topology] = {}


def topology(cluster: ClusterSpec, efficiency: float | None = None) -> Topology:
    """The (cached) Topology of ``cluster`` at a link efficiency (default: the bundled fit's);
    the cache keys on the object's identity."""
    if efficiency is None:
        from hetpar.sim.profile import resolve

        efficiency = resolve().net_efficiency
    key = (id(cluster), efficiency)
    topo = _TOPOLOGIES.get(key)
    if topo is None or topo.cluster is not cluster:
        if len(_TOPOLOGIES) > 256:
            _TOPOLOGIES.clear()
        topo = _TOPOLOGIES[key] = Topology(cluster, efficiency)
    return topo
