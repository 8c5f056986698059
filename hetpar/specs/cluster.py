"""Cluster description: node groups of GPUs and the network tiers and links that join them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.specs.gpu import GPUSpec

TierKind = Literal["rack", "pod", "datacenter", "wan"]
CollectiveSet = Literal["nccl", "hierarchical", "best"]


@dataclass(frozen=True, kw_only=True)
class LocalLink:
    """A link inside a node, as topology data: an NVLink bridge, a PCIe switch, a NIC.

    ``gpus`` are the node-local indices it joins (a bridge: two; a switch: those below it).
    ``shared``: one uplink of ``bandwidth_gbps`` for all of them (a PCIe switch, a NIC behind
    it) rather than that bandwidth per GPU.
    """

    kind: str
    """A link kind of hetpar/catalog/links (nvlink, pcie, ib, tcp)."""
    gpus: tuple[int, ...]
    bandwidth_gbps: float
    latency_us: float = 0.0
    shared: bool = False
    split: bool = False
    """One collective may be split over this link and the node's PCIe path at once (a
    runtime that stripes it, as the seed paper's does). False: the library uses one path per
    peer (NCCL picks the fastest, src/graph/paths.cc), so the paths are never summed."""

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0 or self.latency_us < 0 or not self.gpus:
            raise ConfigError(
                f"local link {self.kind!r} {list(self.gpus)}: need gpus, bandwidth_gbps > 0 "
                f"and latency_us >= 0; got {self.bandwidth_gbps}, {self.latency_us}"
            )


RDMA_MIN_NODE_GBPS = 100.0
"""Below this node NIC rate a cluster file that does not say is taken as Ethernet with NCCL's
socket transport: the RDMA fabrics GPU clusters use run at 100 Gb/s per port and more (InfiniBand
EDR 100, HDR 200, NDR 400; RoCE on 100-400 GbE), AWS offers GPUDirect RDMA over EFA only on
p4d and later (400 Gb/s per node; p3.8xlarge and g4dn are 10-50 Gb/s ENA:
https://aws.amazon.com/ec2/instance-types/p3/, https://aws.amazon.com/hpc/efa/), and
GeForce cards do not support GPUDirect RDMA at all
(https://docs.nvidia.com/cuda/gpudirect-rdma/, "supported on Tesla and Quadro")."""

MAX_GPUS = 1 << 20
"""GPUs one node group may have: 8x the largest machines built (2025); beyond it a typo, and
the planner's per-device bookkeeping would take minutes and gigabytes before any answer."""


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """Identical nodes of one GPU type. Devices are numbered node-major inside the group."""

    name: str
    gpu: str | GPUSpec
    """GPU type: a catalog name, a path to a GPU file, or the GPU itself (a value, e.g. a
    straggler's slowed GPU); ``hetpar.catalog.gpu_spec`` resolves it."""
    num_nodes: int
    gpus_per_node: int
    scaleup_size: int | None = None
    """GPUs in one scale-up (NVLink) domain; default: one node. May span nodes (NVL72)."""
    scaleup_bandwidth_gbps: float | None = None
    """Per-GPU unidirectional bandwidth inside a scale-up domain; default: the GPU's link."""
    scaleup_latency_us: float = 3.0
    node_bandwidth_gbps: float | None = None
    """Between GPUs of one node that are not in one scale-up domain (PCIe); default: scale-up."""
    nic_bandwidth_gbps: float = 200.0
    """Per-GPU network bandwidth leaving the node (scale-out), unidirectional."""
    nic_latency_us: float = 5.0
    zone: str = ""
    """Zone or site; groups in different zones talk over the `wan` tier or an explicit link."""
    scaleup_kind: str | None = None
    """Link kind of the scale-up domain (hetpar/catalog/links); default: from the GPU's link."""
    node_kind: str = "pcie"
    """Link kind between scale-up domains of one node."""
    gpudirect_rdma: bool | None = None
    """The NIC reads GPU memory directly (InfiniBand/RoCE/EFA); false: traffic is staged
    through host memory over TCP sockets, as on most cloud VMs and Ethernet workstations.
    Unset: true when the node's NIC bandwidth (nic_bandwidth_gbps x gpus_per_node) is at
    least ``RDMA_MIN_NODE_GBPS``, else false (see there)."""
    nic_kind: str | None = None
    """Link kind of the NIC; default: ``ib`` with GPUDirect RDMA, else ``tcp``."""
    nic_shared: bool = False
    """One NIC per node shared by its GPUs (cloud VMs, workstations): a GPU gets the node's
    nic_bandwidth_gbps x gpus_per_node divided by the GPUs of that node the plan uses, not
    a fixed 1/gpus_per_node share. False: one NIC (rail) per GPU."""
    local_links: tuple[LocalLink, ...] = ()
    """Links inside a node as data (NVLink bridges, PCIe switches); see LocalLink."""

    def __post_init__(self) -> None:
        for k in ("num_nodes", "gpus_per_node"):
            if getattr(self, k) < 1:
                raise ConfigError(
                    f"node group {self.name!r}: {k} must be >= 1, got {getattr(self, k)}")
        if self.num_gpus > MAX_GPUS:
            raise ConfigError(
                f"node group {self.name!r}: {self.num_nodes} x {self.gpus_per_node} GPUs not "
                f"allowed; allowed: at most {MAX_GPUS:,} GPUs per group"
            )
        if self.scaleup_size is not None:
            s, g = self.scaleup_size, self.gpus_per_node
            if s < 1 or (s % g and g % s) or s > g * self.num_nodes:
                raise ConfigError(
                    f"node group {self.name!r}: scaleup_size ({s}) must divide or be a "
                    f"multiple of gpus_per_node ({g}) and at most the group's "
                    f"{g * self.num_nodes} GPUs"
                )
        for k in ("scaleup_latency_us", "nic_latency_us"):
            if getattr(self, k) < 0:
                raise ConfigError(
                    f"node group {self.name!r}: {k} must be >= 0, got {getattr(self, k)}"
                )
        for k in ("scaleup_bandwidth_gbps", "node_bandwidth_gbps", "nic_bandwidth_gbps"):
            v = getattr(self, k)
            if v is not None and v <= 0:
                raise ConfigError(f"node group {self.name!r}: {k} must be > 0, got {v}")
        for lk in self.local_links:
            bad = [i for i in lk.gpus if not 0 <= i < self.gpus_per_node]
            if bad:
                raise ConfigError(
                    f"node group {self.name!r}: local link {lk.kind!r} names GPU {bad[0]}; "
                    f"a node has GPUs 0..{self.gpus_per_node - 1}"
                )

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def gpu_name(self) -> str:
        """The GPU as the group names it: its reference, or a GPU value's own name."""
        return self.gpu if isinstance(self.gpu, str) else self.gpu.name

    @property
    def rdma(self) -> bool:
        """Whether inter-node traffic uses GPUDirect RDMA (stated, or inferred from the rate)."""
        if self.gpudirect_rdma is not None:
            return self.gpudirect_rdma
        return self.nic_bandwidth_gbps * self.gpus_per_node >= RDMA_MIN_NODE_GBPS

    @property
    def domain_size(self) -> int:
        """GPUs per scale-up domain."""
        return self.scaleup_size if self.scaleup_size is not None else self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class NetworkTier:
    """A scale-out tier (rack, pod, data center, wide area) above the nodes.

    ``size_gpus`` GPUs share one instance of the tier (0 = the whole cluster); traffic that
    leaves every smaller tier crosses this one at ``bandwidth_gbps`` per GPU divided by
    ``oversubscription``.
    """

    name: str
    kind: TierKind
    size_gpus: int
    bandwidth_gbps: float
    latency_us: float
    oversubscription: float = 1.0
    fabric: str | None = None
    """Fabric kind of this tier's links (hetpar/catalog/links: ``tcp`` for a wide-area hop,
    ``roce``, ``ib``...), whose efficiency, protocols and own latency price what crosses it;
    default: the NICs' kind."""

    def __post_init__(self) -> None:
        if self.size_gpus < 0:
            raise ConfigError(f"tier {self.name!r}: size_gpus must be >= 0, got {self.size_gpus}")
        if self.bandwidth_gbps <= 0 or self.latency_us < 0 or self.oversubscription < 1:
            raise ConfigError(
                f"tier {self.name!r}: need bandwidth_gbps > 0, latency_us >= 0 and "
                f"oversubscription >= 1; got {self.bandwidth_gbps}, {self.latency_us}, "
                f"{self.oversubscription}"
            )


@dataclass(frozen=True, kw_only=True)
class Link:
    """A path between two node groups that differs from the tiers (e.g. two zones), or
    between specific nodes (``a_nodes`` of group ``a`` and ``b_nodes`` of group ``b``, which
    may be the same group)."""

    a: str
    b: str
    bandwidth_gbps: float
    """Per-GPU unidirectional bandwidth of traffic between the two groups."""
    latency_us: float
    a_nodes: tuple[int, ...] = ()
    """Node indices inside group ``a`` the link joins; empty: every node of the group."""
    b_nodes: tuple[int, ...] = ()
    kind: str | None = None
    """Link kind (hetpar/catalog/links); default: the NIC kind of the slower end."""

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0:
            raise ConfigError(f"link {self.a}-{self.b}: bandwidth_gbps must be > 0, "
                              f"got {self.bandwidth_gbps}")
        if self.latency_us < 0:
            raise ConfigError(f"link {self.a}-{self.b}: latency_us must be >= 0, "
                              f"got {self.latency_us}")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Node groups, scale-out tiers (smallest first) and special links between groups."""

    name: str
    node_groups: tuple[NodeGroup, ...]
    tiers: tuple[NetworkTier, ...] = ()
    links: tuple[Link, ...] = ()
    collectives: CollectiveSet = "nccl"
    """Collective algorithms the communication stack offers, the cheapest used per
    communicator: ``nccl`` (ring or tree, as NCCL's tuner picks), ``hierarchical`` (also
    inside-nodes-first and type-first reduce-scatter across node groups, which ``hetpar run``
    executes), ``best`` (also a split over parallel paths, modelled only)."""
    nccl_version: str = ""
    """The collective library's version, ``"2.18"`` or ``"2.18.3"``: an older NCCL lacks LL128
    and the tree inside one node (before 2.5), NVLink SHARP (2.17) and PAT (2.23)
    (hetpar.net.tuner). Empty: current."""
    description: str = ""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.node_groups:
            raise ConfigError(f"cluster {self.name!r}: node_groups is empty")
        names = [g.name for g in self.node_groups]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"cluster {self.name!r}: duplicate node group {sorted(dup)[0]!r}")
        for link in self.links:
            for end, nodes in ((link.a, link.a_nodes), (link.b, link.b_nodes)):
                if end not in names:
                    raise ConfigError(
                        f"cluster {self.name!r}: link names unknown node group {end!r}; "
                        f"known: {', '.join(names)}"
                    )
                g = self.node_groups[names.index(end)]
                bad = [i for i in nodes if not 0 <= i < g.num_nodes]
                if bad:
                    raise ConfigError(
                        f"cluster {self.name!r}: link {link.a}-{link.b} names node {bad[0]} of "
                        f"{end!r}, which has nodes 0..{g.num_nodes - 1}"
                    )
            if link.a == link.b and not (link.a_nodes and link.b_nodes):
                raise ConfigError(
                    f"cluster {self.name!r}: link {link.a}-{link.b} inside one group needs "
                    f"a_nodes and b_nodes"
                )
        if self.nccl_version and not re.fullmatch(r"\d+\.\d+(\.\d+)?", self.nccl_version):
            raise ConfigError(f"cluster {self.name!r}: nccl_version={self.nccl_version!r} not "
                              f"allowed; allowed: MAJOR.MINOR[.PATCH], e.g. '2.18'")
        sizes = [t.size_gpus or self.num_gpus for t in self.tiers]
        if sizes != sorted(sizes):
            got = ", ".join(f"{t.name} size_gpus={t.size_gpus}" + ("" if t.size_gpus else
                                                                   f" (all {self.num_gpus})")
                            for t in self.tiers)
            raise ConfigError(f"cluster {self.name!r}: tiers must go from smallest to largest "
                              f"size_gpus; got {got}")

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @property
    def library(self) -> tuple[int, int] | None:
        """``nccl_version`` as (major, minor); None when unstated (the current NCCL)."""
        if not self.nccl_version:
            return None
        major, minor = self.nccl_version.split(".")[:2]
        return int(major), int(minor)

    def group(self, name: str) -> NodeGroup:
        """The node group called ``name`` or ConfigError listing the known ones."""
        for g in self.node_groups:
            if g.name == name:
                return g
        known = ", ".join(g.name for g in self.node_groups)
        raise ConfigError(f"cluster {self.name!r}: unknown node group {name!r}; known: {known}")

    def group_offset(self, name: str) -> int:
        """Global index of the first device of group ``name`` (groups are numbered in order)."""
        off = 0
        for g in self.node_groups:
            if g.name == name:
                return off
            off += g.num_gpus
        raise ConfigError(f"cluster {self.name!r}: unknown node group {name!r}")
