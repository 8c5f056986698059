"""Link kinds (NVLink, PCIe, RDMA NIC, TCP sockets): achieved bandwidth and NCCL protocol costs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hetpar.errors import ConfigError
from hetpar.io import from_dict, read_document

ROOT = Path(__file__).resolve().parent.parent / "catalog" / "links"


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """One NCCL protocol on one link kind (NCCL's alpha-beta tuning model, src/graph/tuning.cc).

    A collective on this protocol costs ``base_latency_us`` once, a hop latency per sequential
    step, and moves bytes at ``bandwidth_fraction`` (ring) or ``tree_bandwidth_fraction``
    (tree) of what the Simple protocol achieves on the link. NCCL's tuner scales the Simple bus
    bandwidth so: ring LL x 1/4, ring LL128 x 0.92, tree LL x 1/3.8, tree LL128 x 7/9 inside a
    node and x 0.915 across nodes (ncclTopoTuneModel, "Various model refinements").
    """

    name: str
    bandwidth_fraction: float
    """Ring bandwidth over the Simple protocol's."""
    tree_bandwidth_fraction: float
    """Tree bandwidth over the Simple protocol's (a tree spanning nodes takes the outermost
    level's value, as NCCL picks its factor by node count)."""
    base_latency_us: float
    hop_latency_us: float
    """Per ring step (NCCL hwLat, ring column)."""
    tree_hop_latency_us: float
    """Per tree level (NCCL hwLat, tree column)."""

    def __post_init__(self) -> None:
        for k in ("bandwidth_fraction", "tree_bandwidth_fraction"):
            if not 0 < getattr(self, k) <= 1:
                raise ConfigError(
                    f"protocol {self.name!r}: {k} must be in (0, 1], got {getattr(self, k)}"
                )
        for k in ("base_latency_us", "hop_latency_us", "tree_hop_latency_us"):
            if getattr(self, k) < 0:
                raise ConfigError(f"protocol {self.name!r}: {k} must be >= 0")


@dataclass(frozen=True, kw_only=True)
class LinkKind:
    """A kind of link: the fraction of line rate NCCL achieves on it and its protocols."""

    name: str
    efficiency: float
    """Achieved large-message bandwidth over line rate (bus bandwidth of a ring, measured)."""
    protocols: tuple[Protocol, ...]
    scale_out: bool = False
    """A network link between nodes: NCCL's tree spans such a level as a binary tree
    (log2 levels); inside a node it is a chain (tuning.cc)."""
    tree_bandwidth: float = 0.92
    """A tree all-reduce's bandwidth relative to a ring's (NCCL tuning.cc applies 0.92)."""
    net_latency_us: float = 0.0
    """The fabric's own latency per message across the network, added to every inter-node
    step (twice on Simple, for the flush), as NCCL adds its network plugin's reported
    ``latency`` (graph latencyInter, tuning.cc); 0 for NCCL's own IB and socket plugins."""
    nvls_efficiency: float = 0.0
    ll_max_busbw_gbyte_s: tuple[float, ...] = ()
    """NCCL's cap on the LL protocol's bus bandwidth for a communicator across this network,
    on two nodes and on more (tuning.cc ``llMaxBws``, the Intel-host row; empty: no cap)."""
    """NVLink SHARP (NVLS) on this scale-up fabric: NCCL's nvlsEfficiency (0: no NVLS)."""
    search_fraction: float = 1.0
    """NCCL's topology bandwidth of this link over its line rate, what its channel search
    divides (topo.h ncclTopoNVLinkBw: SMxx_NVLINK_BW GB/s per NVLink); 1: the line rate."""
    channel_threads: int = 0
    """Threads the library runs per channel on every protocol where it is not NCCL's
    per-protocol maxThreads (RCCL on AMD: NCCL_MAX_NTHREADS 256, ROCm/rccl device.h); 0: NCCL's."""
    nccl_channels: bool = True
    """NCCL runs collectives on this kind on channels it drops for medium messages (enqueue.cc,
    ``Line.run``); false where the kind's values are an envelope already measured end to end
    (``measured``: what ``hetpar probe`` fitted)."""
    matches: tuple[str, ...] = ()
    """Prefixes of a GPU file's ``scaleup_link`` text that mean this kind (the longest
    matching prefix over all kinds wins: ``NVLink4`` before ``NVLink``)."""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not 0 < self.efficiency <= 1:
            raise ConfigError(f"link kind {self.name!r}: efficiency must be in (0, 1]")
        if self.net_latency_us < 0 or not 0 <= self.nvls_efficiency <= 1:
            raise ConfigError(f"link kind {self.name!r}: need net_latency_us >= 0 and "
                              f"nvls_efficiency in [0, 1]; got {self.net_latency_us}, "
                              f"{self.nvls_efficiency}")
        if len(self.ll_max_busbw_gbyte_s) not in (0, 2) or not all(
                v > 0 for v in self.ll_max_busbw_gbyte_s):
            raise ConfigError(f"link kind {self.name!r}: ll_max_busbw_gbyte_s must be empty or "
                              f"[two nodes, more] > 0; got {list(self.ll_max_busbw_gbyte_s)}")
        if not any(p.bandwidth_fraction == 1.0 for p in self.protocols):
            raise ConfigError(f"link kind {self.name!r}: needs a protocol at full bandwidth")

    @property
    def simple(self) -> Protocol:
        """The full-bandwidth protocol (NCCL's Simple): its hop latency anchors the others."""
        return next(p for p in self.protocols if p.bandwidth_fraction == 1.0)


def names() -> list[str]:
    """Names of the bundled link kinds."""
    return sorted(p.stem for p in ROOT.glob("*.toml"))


@lru_cache(maxsize=64)
def load_link_kind(name: str) -> LinkKind:
    """The link kind ``name`` (a file of hetpar/catalog/links) or ConfigError listing them."""
    path = ROOT / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown link kind {name!r}; known: {', '.join(names())}")
    return from_dict(LinkKind, read_document(path), path.name)


def kind_of_link(text: str) -> LinkKind:
    """The link kind whose ``matches`` prefixes a GPU file's ``scaleup_link`` (default nvlink);
    of several, the one with the longest matching prefix."""
    best, length = load_link_kind("nvlink"), -1
    for n in names():
        kind = load_link_kind(n)
        for m in kind.matches:
            if text.startswith(m) and len(m) > length:
                best, length = kind, len(m)
    return best


def staged(kind: LinkKind, p2p: bool) -> LinkKind:
    """The kind a ``kind`` path between two cards really is: PCIe between cards without
    peer-to-peer (``GPUSpec.p2p``, GeForce) is staged through host memory, the sender's PCIe
    link, a host-memory copy, the receiver's link (NCCL's SHM transport, whose measured
    efficiency in shm.toml is that whole route)."""
    if kind.name == "pcie" and not p2p:
        return load_link_kind("shm")
    return kind
