"""A cluster's network as levels: scale-up domain, node, NIC, tiers, node-pair and group links."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetpar.net.collectives import Level, Path
from hetpar.net.links import LinkKind, kind_of_link, load_link_kind, staged
from hetpar.net.local import below_one_switch, splits, switches
from hetpar.specs.cluster import ClusterSpec, Link, NodeGroup
from hetpar.specs.gpu import GPUSpec

Device = tuple[str, int]


def _rate(gbps: float, kind: LinkKind) -> float:
    """Achieved bytes/s of a link of ``gbps`` line rate (the kind's measured efficiency)."""
    return gbps * 1e9 / 8 * kind.efficiency


@dataclass(frozen=True, slots=True)
class Classified:
    """Where a communicator's ranks sit: legacy two-level summary plus the full hierarchy."""

    k: int
    inner: Path
    outer: Path | None
    levels: tuple[Level, ...]
    alternatives: tuple[tuple[Level, ...], ...] = ()
    inners: tuple[Path, ...] = ()


class NetworkView:
    """Paths of one cluster (optionally as used by one plan: GPUs in use per node).

    ``gpus`` is each node group's GPU, resolved by the caller (hardware arrives as values:
    a slowed GPU is just another GPUSpec; nothing is looked up by name here).
    """

    def __init__(self, cluster: ClusterSpec, gpus: dict[str, GPUSpec],
                 usage: dict[tuple[str, int], int] | None = None,
                 flows: dict[tuple[str, int], int] | None = None):
        assert set(gpus) == {g.name for g in cluster.node_groups}, "a GPU per node group"
        self.cluster = cluster
        self.usage = usage or {}
        self.flows = flows or {}
        """Pipeline sends leaving each (group, node) at once (see busy.pipeline_flows)."""
        self.groups = {g.name: g for g in cluster.node_groups}
        self.offsets = {g.name: cluster.group_offset(g.name) for g in cluster.node_groups}
        self.gpus = gpus
        self.inner = {g.name: self._inner_path(g) for g in cluster.node_groups}
        self.node = {g.name: self._node_path(g) for g in cluster.node_groups}
        self.nic_kind = {g.name: self._nic_kind(g) for g in cluster.node_groups}

    # --- paths of one group ---------------------------------------------------------------
    def _inner_path(self, g: NodeGroup) -> Path:
        gpu = self.gpus[g.name]
        kind = load_link_kind(g.scaleup_kind) if g.scaleup_kind else kind_of_link(gpu.scaleup_link)
        if not g.scaleup_kind and kind.name == "pcie" and not any(
                lk.kind == "pcie" for lk in g.local_links):
            # PCIe cards with no PCIe switch stated meet at the CPU host bridge, where NCCL
            # does not use P2P (paths.cc, p2pLevel = PATH_PXB): its SHM transport (shm.toml)
            kind = load_link_kind("shm")
        if not g.scaleup_kind and kind.nvls_efficiency and g.domain_size <= 4:
            # NVLink SHARP needs an NVSwitch; domains of up to 4 GPUs join them directly
            # (HGX H100 4-GPU, GH200 quad nodes): the kind without NVLS (nvlink4.toml)
            kind = load_link_kind("nvlink")
        kind = staged(kind, gpu.p2p)
        gbps = g.scaleup_bandwidth_gbps or gpu.scaleup_bandwidth_gbps
        return Path("scale-up", _rate(gbps, kind), g.scaleup_latency_us * 1e-6, kind)

    def _node_path(self, g: NodeGroup) -> Path:
        inner = self.inner[g.name]
        if g.node_bandwidth_gbps is None:
            return Path("node", inner.bandwidth, inner.latency, inner.kind)
        kind = staged(load_link_kind(g.node_kind), self.gpus[g.name].p2p)
        if kind.name == "pcie":  # between switches or root ports the route meets at the CPU
            kind = load_link_kind("shm")  # host bridge: no P2P (paths.cc PATH_PXB), SHM
        bw = _rate(g.node_bandwidth_gbps, kind)
        for _, lk in switches(g, shared=True):  # GPUs below it share its uplink when crossing
            bw = min(bw, _rate(lk.bandwidth_gbps, kind) / len(lk.gpus))
        return Path("node", bw, inner.latency, kind)

    def _below_switch(self, g: NodeGroup, idx: Sequence[int]) -> Path | None:
        """The node path of devices below one switch: P2P where the cards have it, no uplink."""
        if g.node_bandwidth_gbps is None or not below_one_switch(
                g, {i % g.gpus_per_node for i in idx}):
            return None
        kind = staged(load_link_kind(g.node_kind), self.gpus[g.name].p2p)
        return Path("node", _rate(g.node_bandwidth_gbps, kind), self.node[g.name].latency, kind)

    def _nic_kind(self, g: NodeGroup) -> LinkKind:
        if g.nic_kind:
            return load_link_kind(g.nic_kind)
        return load_link_kind("ib" if g.rdma else "tcp")

    def nic_rate(self, g: NodeGroup, nodes: Sequence[int] = (), *, p2p: bool = False,
                 flows: int | None = None) -> float:
        """Bytes/s per flow leaving a node: a fixed share per GPU, or with ``nic_shared`` the
        node's whole NIC split fairly among the flows that use it at once: for collectives
        the GPUs of the busiest node the plan uses, for a pipeline send the sends leaving
        that node together (``flows`` overrides both)."""
        per_gpu = g.nic_bandwidth_gbps
        table = self.flows if p2p else self.usage
        if g.nic_shared and (flows or table):
            used = flows or max((table.get((g.name, i), g.gpus_per_node) for i in nodes),
                                default=g.gpus_per_node)
            per_gpu = g.nic_bandwidth_gbps * g.gpus_per_node / max(used, 1)
        return _rate(per_gpu, self.nic_kind[g.name])

    def usage_of(self, devices: Sequence[Device]) -> dict[tuple[str, int], int]:
        """GPUs in use per (group, node), only for groups with a shared NIC and spare GPUs."""
        out: dict[tuple[str, int], int] = {}
        for name, i in devices:
            g = self.groups[name]
            if g.nic_shared:
                key = (name, i // g.gpus_per_node)
                out[key] = out.get(key, 0) + 1
        return {k: v for k, v in out.items() if v < self.groups[k[0]].gpus_per_node}

    def p2p_path(self, a: Device, b: Device, flows: int | None = None) -> Path:
        """The path of one pipeline send from ``a`` to ``b``.

        Where a node's NIC is shared (``nic_shared``), the send gets the NIC's fair share
        among the pipeline sends that leave (enter) that node together, not a fixed
        1/gpus_per_node of it; ``flows`` overrides that count for both ends.
        """
        c = self.classify([a, b])
        path = c.outer or c.inner
        ga, gb = self.groups[a[0]], self.groups[b[0]]
        if c.outer is None or path.scope == "node" or path.scope.startswith("link"):
            return path
        if not (ga.nic_shared or gb.nic_shared):
            return path
        ends = [self.nic_rate(g, (d[1] // g.gpus_per_node,), p2p=True, flows=flows)
                for g, d in ((ga, a), (gb, b))]
        return Path(path.scope, min(*ends, self._tier_cap(path)), path.latency, path.kind)

    def _tier_cap(self, path: Path) -> float:
        """What an oversubscribed tier leaves one flow (its per-GPU uplink share); a
        non-blocking tier adds no cap beyond the NICs."""
        for tier in self.cluster.tiers:
            if tier.name == path.scope and path.kind is not None and tier.oversubscription > 1:
                return _rate(tier.bandwidth_gbps, path.kind) / tier.oversubscription
        return float("inf")

    # --- classification -------------------------------------------------------------------
    def classify(self, devices: Sequence[Device]) -> Classified:
        names = {d[0] for d in devices}
        if len(names) == 1:
            return self._one_group(self.groups[devices[0][0]], [d[1] for d in devices])
        inner = min((self.inner[x] for x in names), key=lambda p: p.bandwidth)
        per_dom: dict[tuple[str, int], int] = {}
        for name, i in devices:
            key = (name, i // self.groups[name].domain_size)
            per_dom[key] = per_dom.get(key, 0) + 1
        n, k = len(devices), min(per_dom.values())
        k = k if n % k == 0 else 1
        outer = self._outer(devices, names)
        lv = (Level(k, inner), Level(n // k, outer))
        inners = tuple(self.inner[x] for x in sorted(names))
        return Classified(k=k, inner=inner, outer=outer, levels=lv, inners=inners)

    def _one_group(self, g: NodeGroup, idx: Sequence[int]) -> Classified:
        n, dom = len(idx), g.domain_size
        lo, hi = min(idx), max(idx)
        inner = self.inner[g.name]
        if lo // dom == hi // dom:
            alts: tuple[tuple[Level, ...], ...] = ()
            if g.node_bandwidth_gbps is not None and n == 2 and splits(g, idx):
                # a pair whose link declares ``split`` also uses its PCIe path in parallel;
                # otherwise the library takes one path per peer and the two are never summed
                alts = ((Level(n, self.node[g.name]),),)
            return Classified(k=n, inner=inner, outer=None, levels=(Level(n, inner),),
                              alternatives=alts)
        per = _count([i // dom for i in idx])
        k = min(per.values())
        k = k if n % k == 0 and max(per.values()) == k else 1
        node = max(g.gpus_per_node, dom)
        if lo // node == hi // node:
            outer = self._below_switch(g, idx) or self.node[g.name]
            return Classified(k=k, inner=inner, outer=outer,
                              levels=(Level(k, inner), Level(n // k, outer)))
        nodes = sorted({i // node for i in idx})
        outer = self._scaleout([g], [self.offsets[g.name] + i for i in idx], nodes, k)
        outer = self._pair_links(g, nodes, outer)
        return Classified(k=k, inner=inner, outer=outer, levels=self._levels(g, idx, k, outer))

    def _levels(self, g: NodeGroup, idx: Sequence[int], k: int, outer: Path) -> tuple[Level, ...]:
        """Three levels (domain, node, network) when the ranks fill domains and nodes evenly."""
        n, dom, gpn = len(idx), g.domain_size, g.gpus_per_node
        two = (Level(k, self.inner[g.name]), Level(n // k, outer))
        if dom >= gpn or k == 1:
            return two
        per_node = _count([i // gpn for i in idx])
        u = min(per_node.values())
        if max(per_node.values()) != u or u % k or u == k:
            return two
        return (Level(k, self.inner[g.name]), Level(u // k, self.node[g.name]),
                Level(n // u, outer))

    def _outer(self, devices: Sequence[Device], names: set[str]) -> Path:
        groups = [self.groups[x] for x in names]
        glob = [self.offsets[x] + i for x, i in devices]
        nodes = sorted({i // self.groups[x].gpus_per_node for x, i in devices})
        base = self._scaleout(groups, glob, nodes, 1,
                              wan=len({g.zone for g in groups}) > 1)
        for lk in self.cluster.links:
            if lk.a == lk.b or not {lk.a, lk.b} <= names or not _covers(lk, devices, self):
                continue
            kind = load_link_kind(lk.kind) if lk.kind else min(
                (self.nic_kind[x] for x in (lk.a, lk.b)), key=lambda q: q.efficiency)
            bw = _rate(lk.bandwidth_gbps, kind)
            if bw < base.bandwidth:
                base = Path(f"link {lk.a}-{lk.b}", bw, lk.latency_us * 1e-6, kind)
        return base

    def _pair_links(self, g: NodeGroup, nodes: Sequence[int], base: Path) -> Path:
        """A ring over ``nodes`` in order: its slowest edge, where a node-pair link is stated."""
        if len(nodes) < 2:
            return base
        edges = set(zip(nodes, nodes[1:], strict=False))
        if len(nodes) > 2:
            edges.add((nodes[-1], nodes[0]))
        out = base
        for lk in self.cluster.links:
            if lk.a != g.name or lk.b != g.name:
                continue
            for a, b in edges:
                if (a in lk.a_nodes and b in lk.b_nodes) or (b in lk.a_nodes and a in lk.b_nodes):
                    kind = load_link_kind(lk.kind) if lk.kind else self.nic_kind[g.name]
                    bw = _rate(lk.bandwidth_gbps, kind)
                    if bw < out.bandwidth:
                        out = Path(f"link {g.name}[{a}]-[{b}]", bw, lk.latency_us * 1e-6, kind)
        return out

    def _scaleout(self, groups: Sequence[NodeGroup], glob: Sequence[int], nodes: Sequence[int],
                  k: int, *, wan: bool = False) -> Path:
        """The NIC share plus the smallest tier instance holding global devices ``glob``.

        An oversubscribed tier is billed by the rings that cross it: a ring with r of its
        ranks in each instance crosses the instance's uplink once per k-rank unit, so each
        crossing gets r/k times the per-GPU share of the uplink (at most the NIC's rate).
        """
        nic = min(self.nic_rate(g, nodes) for g in groups)
        kind = min((self.nic_kind[g.name] for g in groups), key=lambda q: q.efficiency)
        lat = max(g.nic_latency_us for g in groups) * 1e-6
        total, lo, hi = self.cluster.num_gpus, min(glob), max(glob)
        unit = max(g.gpus_per_node for g in groups)  # what the smallest tier's downlinks serve
        for tier in self.cluster.tiers:
            if wan and tier.kind != "wan":
                continue
            size = tier.size_gpus or total
            if lo // size == hi // size or tier is self.cluster.tiers[-1]:
                # ranks of this communicator behind each downlink of the tier
                r = min(_count([i // unit for i in glob]).values())
                # a tier may name its own fabric kind (a WAN over TCP above RDMA NICs)
                tkind = load_link_kind(tier.fabric) if tier.fabric else kind
                share = _rate(tier.bandwidth_gbps, tkind) / tier.oversubscription
                bw = min(nic, share * max(r / max(k, 1), 1.0))
                return Path(tier.name, bw, lat + tier.latency_us * 1e-6, tkind)
            unit = size
        return Path("network", nic, lat, kind)


def _count(keys: Sequence[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for x in keys:
        out[x] = out.get(x, 0) + 1
    return out


def _covers(lk: Link, devices: Sequence[Device], view: NetworkView) -> bool:
    """Whether every device of the link's groups lies on the nodes the link joins."""
    for end, nodes in ((lk.a, lk.a_nodes), (lk.b, lk.b_nodes)):
        if not nodes:
            continue
        gpn = view.groups[end].gpus_per_node
        if any(x == end and i // gpn not in nodes for x, i in devices):
            return False
    return True
