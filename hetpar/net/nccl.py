"""NCCL's ring and tree as (algorithm, protocol) lines its tuner prices (NVLS, PAT: ``nccl_nvls``).

A communicator is a list of ``Level``s, innermost first: ``size`` units of the level below
(ranks at level 0) joined by ``path``. Each (algorithm, protocol) costs what NCCL's tuner says
(src/graph/tuning.cc, ``ncclTopoTuneModel``: constants in ``hetpar.net.tuner``): a latency from
its base and hop latencies, and bytes over the busiest level's capacity; the link kinds
(``hetpar/catalog/links``) supply the per-fabric latencies and efficiencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hetpar.net import channels, tuner
from hetpar.net.links import LinkKind, Protocol


@dataclass(frozen=True, slots=True)
class Path:
    """One level of the network as seen by one GPU: achieved bytes/s per direction, latency.

    ``latency`` is the hop latency of NCCL's Simple protocol; ``kind`` (None: a plain
    alpha-beta link with no protocol choice) scales it for the other protocols.
    """

    scope: str
    bandwidth: float
    latency: float
    kind: LinkKind | None = None
    arch: int = 0
    """Compute capability (major x 10 + minor) of the communicator's slowest GPU, NCCL's
    minCompCap, which picks its per-channel caps (``hetpar.net.channels``); 0: unknown."""


@dataclass(frozen=True, slots=True)
class Level:
    """``size`` units of the level below joined by ``path`` (bandwidth per GPU of the unit)."""

    size: int
    path: Path


Op = str
"""'all_reduce', 'reduce_scatter' or 'all_gather' (sizes are the full, unsharded bytes)."""

_PLAIN = Protocol(name="plain", bandwidth_fraction=1.0, tree_bandwidth_fraction=1.0,
                  base_latency_us=0.0, hop_latency_us=1.0, tree_hop_latency_us=1.0)


def _protocols(levels: Sequence[Level]) -> list[tuple[Protocol, ...]]:
    """Per level, its protocols; only protocols every level offers are usable together."""
    return [lv.path.kind.protocols if lv.path.kind else (_PLAIN,) for lv in levels]


def common(levels: Sequence[Level]) -> list[list[Protocol]]:
    """One list per usable protocol name: that protocol's entry on every level."""
    per = _protocols(levels)
    names = [p.name for p in per[0]]
    out = []
    for name in names:
        row = [next((p for p in ps if p.name == name), None) for ps in per]
        if all(p is not None for p in row):
            out.append([p for p in row if p is not None])
    # levels with different kinds share no name: fall back to each level's Simple protocol
    return out or [[next(p for p in ps if p.bandwidth_fraction == 1.0) for ps in per]]


def _hop(lv: Level, p: Protocol, tree: bool = False) -> float:
    """Hop latency of protocol ``p`` on ``lv``: the path's Simple latency scaled by NCCL's ratio."""
    kind = lv.path.kind
    if kind is None:
        return lv.path.latency
    ref = kind.simple
    own, base = (p.tree_hop_latency_us, ref.tree_hop_latency_us) if tree else (
        p.hop_latency_us, ref.hop_latency_us)
    return lv.path.latency * (own / base if base else 1.0)


def _phases(op: Op) -> int:
    return 2 if op == "all_reduce" else 1


class Line(NamedTuple):
    """One (algorithm, protocol) NCCL's tuner prices: seconds = a + b x bytes / ``corr`` (the
    tree correction; None: 1); ``run`` on ``channels`` (comm->nChannels) less those it drops
    below ``unit`` bytes each (``tuner.channel_bytes``; 0: none)."""

    a: float
    b: float
    corr: tuple[float, ...] | None
    algorithm: str
    protocol: str
    channels: int = 1
    unit: float = 0.0

    def time(self, nbytes: float) -> float:
        """What NCCL's tuner prices (and picks by): every channel at work."""
        return self.a + self.b * nbytes / tuner.correction(self.corr, nbytes)

    def run(self, nbytes: float) -> float:
        """Seconds as NCCL runs it: on fewer channels below ``channels`` x ``unit`` bytes
        (enqueue.cc), each at the tuner's speed (busBw = nChannels x bw): bytes / nc x N."""
        t = self.time(nbytes)
        if nbytes >= self.channels * self.unit:
            return t
        used = tuner.channels_run(nbytes, self.channels, self.unit)
        return t + (t - self.a) * (self.channels / used - 1.0)


def capacity(levels: Sequence[Level]) -> float:
    """A level's boundary is crossed by as many rings (channels) as there are ranks below
    it, so its capacity is that many times its per-GPU bandwidth; the smallest one paces."""
    below, cap = 1, math.inf
    for lv in levels:
        if lv.size > 1:
            cap = min(cap, below * lv.path.bandwidth)
        below *= lv.size
    return cap


def outer(levels: Sequence[Level], i: int) -> bool:
    """Whether level ``i`` joins nodes (NCCL's NET), not GPUs of one node (NVLink, PCI)."""
    kind = levels[i].path.kind
    return kind.scale_out if kind else i == len(levels) - 1


@dataclass(frozen=True, slots=True)
class Comm:
    """What NCCL's tuner reads of a communicator: ranks, nodes, ranks per node (ppn)."""

    n: int
    nodes: int

    @property
    def ppn(self) -> int:
        return self.n // self.nodes


def comm_of(levels: Sequence[Level]) -> Comm:
    n = math.prod(lv.size for lv in levels)
    nodes = math.prod(lv.size for i, lv in enumerate(levels) if outer(levels, i))
    return Comm(n, max(nodes, 1))


def is_simple(p: Protocol) -> bool:
    return p.name == "Simple"


def _ll(p: Protocol) -> bool:
    return p.name == "LL"


def _ll_cap(levels: Sequence[Level], c: Comm) -> float:
    """NCCL's cap on LL's bus bandwidth (bytes/s) across nodes: the outermost network kind's
    ``ll_max_busbw_gbyte_s`` for two nodes or more (tuning.cc llMaxBws); inf on one node."""
    if c.nodes <= 1:
        return math.inf
    for i in range(len(levels) - 1, -1, -1):
        kind = levels[i].path.kind
        if levels[i].size > 1 and outer(levels, i) and kind and kind.ll_max_busbw_gbyte_s:
            return kind.ll_max_busbw_gbyte_s[0 if c.nodes == 2 else 1] * 1e9
    return math.inf


def latencies(levels: Sequence[Level], row: Sequence[Protocol], c: Comm,
               tree: bool) -> tuple[float, float]:
    """(intra-node, inter-node) hop latency of one protocol, as tuning.cc sets intraLat and
    interLat: the slowest hop of each kind of level; across nodes the fabric's own latency
    (``net_latency_us``) once, twice on Simple (the flush); with one GPU per node the
    ring takes the tree's network latency ("latencies are fully exposed"); an intra-node
    step of a multi-node ring costs at least getNetOverhead (x 3 on Simple)."""
    intra = inter = 0.0
    for i, (lv, p) in enumerate(zip(levels, row, strict=True)):
        if lv.size <= 1:
            continue
        if outer(levels, i):
            kind = lv.path.kind
            fabric = kind.net_latency_us * 1e-6 if kind else 0.0
            hop = _hop(lv, p, tree=tree or c.ppn == 1)
            inter = max(inter, hop + fabric * (2 if is_simple(p) else 1))
        else:
            intra = max(intra, _hop(lv, p, tree))
    if c.nodes > 1 and not tree:
        overhead = tuner.NET_OVERHEAD_S * (tuner.SIMPLE_OVERHEAD_FACTOR if is_simple(row[0]) else 1)
        intra = max(intra, overhead if any(lv.path.kind for lv in levels) else 0.0)
    return intra, inter


def net_caps(levels: Sequence[Level], c: Comm) -> tuple[float, channels.Caps] | None:
    """(GB/s of one channel across nodes, NCCL's per-channel maxima) of a communicator that
    spans nodes on GPUs of known architecture; None otherwise (``hetpar.net.channels``: on
    one node NCCL's channel speeds stay below every cap). A channel runs on one NIC at its
    line rate (the path's achieved rate over its kind's efficiency); the search found one
    channel per NIC, i.e. per GPU of a node on rails (``ppn``)."""
    arch = min((lv.path.arch for lv in levels if lv.path.arch), default=0)
    found = channels.caps(arch, c.nodes) if c.nodes > 1 else None
    if found is None:
        return None
    i = max(i for i, lv in enumerate(levels) if lv.size > 1 and outer(levels, i))
    path = levels[i].path
    line = path.bandwidth / (path.kind.efficiency if path.kind else 1.0) / 1e9
    return channels.net_speed(line, arch, c.ppn), found


def channel_count(levels: Sequence[Level], c: Comm) -> tuple[int, bool, int]:
    """(comm->nChannels, ``channels.count`` of the network's line rate or the slowest inside;
    the search carries <= PCI_BW: 256 Simple ring threads; a kind's ``channel_threads``)."""
    inter, used = c.nodes > 1, [lv for lv in levels if lv.size > 1]
    lines = [lv.path.bandwidth / lv.path.kind.efficiency * lv.path.kind.search_fraction / 1e9
             for i, lv in enumerate(levels)
             if lv.size > 1 and lv.path.kind and outer(levels, i) == inter]
    if not lines or not all(math.isfinite(x) for x in lines) or not all(
            lv.path.kind and lv.path.kind.nccl_channels for lv in used):
        return 1, False, 0  # a plain alpha-beta path, or a measured envelope: none dropped
    arch = min((lv.path.arch for lv in levels if lv.path.arch), default=0)
    line = lines[-1] if inter else min(lines)
    n, found = channels.count(line, arch, c.ppn, inter)
    own = [lv.path.kind.channel_threads for lv in used if lv.path.kind]
    return n, found <= tuner.PCI_BW_GBYTE_S, min((t for t in own if t), default=0)


def ring_lines(levels: Sequence[Level], op: Op) -> list[Line]:
    """NCCL's ring per protocol (tuning.cc): latency base + (steps - inter-node steps) x
    intraLat + inter-node steps x interLat, with 2(n-1) steps of which 2(nodes-1) cross
    nodes for an all-reduce (n-1 and nodes-1 otherwise); each rank moves 2(n-1)/n (or
    (n-1)/n) of the bytes (Patarasuk & Yuan 2009) at the smallest level capacity x the
    protocol's bandwidth fraction (LL128 capped per channel across nodes, ``net_caps``). A
    Simple all-reduce across nodes pays NCCL's ring plateau factor on its latency."""
    c = comm_of(levels)
    phases = _phases(op)
    steps, inter_steps = phases * (c.n - 1), phases * (c.nodes - 1)
    cap = capacity(levels)
    per_channel = net_caps(levels, c)
    nch, slow, threads = channel_count(levels, c)
    out = []
    for row in common(levels):
        bus = cap * min(p.bandwidth_fraction for p in row)
        if _ll(row[0]):
            bus = min(bus, _ll_cap(levels, c))
        if row[0].name == "LL128" and per_channel:  # tuning.cc perChMaxRingLL128Bw
            speed, most = per_channel
            bus *= min(1.0, most.ring_ll128 / (speed * min(p.bandwidth_fraction for p in row)))
        intra, inter = latencies(levels, row, c, tree=False)
        a = max(p.base_latency_us for p in row) * 1e-6 + (steps - inter_steps) * intra \
            + inter_steps * inter
        if is_simple(row[0]) and c.nodes > 1 and op == "all_reduce":
            a *= tuner.RING_PLATEAU
        unit = tuner.channel_bytes("ring", row[0].name, c.n, slow, threads)
        out.append(Line(a, steps / c.n / bus, None, "ring", row[0].name, nch, unit))
    return out


def tree_lines(levels: Sequence[Level], op: Op) -> list[Line]:
    """NCCL's double binary tree across nodes with a chain inside them (all-reduce only),
    per protocol. Latency (tuning.cc): base + 2 x ((ppn-1) x intraLat + log2(nodes) x
    interLat). Bytes: every GPU of a chain sends the message up and down, 2 S over its
    links; a node of the double binary tree sends 2 S over its NICs (inner node of one tree,
    leaf of the other: Sanders et al. 2009). On two nodes each tree is one edge, and NCCL's
    search may raise such a tree's intra bandwidth to up to twice its network bandwidth
    (search.cc "increase bwIntra for trees (2 nodes or collnet)"), i.e. S per node; but
    training runs measured on two nodes (vTrain's TP 16 over two A100 nodes, AMP's data
    parallelism over two V100 VMs, hetpar/catalog/validation) move 2 S, so 2 S is priced here
    and the explicit 2-node case is NVLS_TREE's (``nvls_tree_lines``). The busiest level
    paces, at the link kind's ``tree_bandwidth`` (NCCL's 0.92) x the protocol's tree
    fraction, each capped per channel across nodes (``net_caps``); NCCL's tree correction
    factors scale it for medium sizes.
    """
    if op != "all_reduce":
        return []
    c = comm_of(levels)
    factor = levels[-1].path.kind.tree_bandwidth if levels[-1].path.kind else 1.0
    top = max(i for i, lv in enumerate(levels) if lv.size > 1)
    below, per_byte = 1, 0.0
    for lv in levels:
        if lv.size > 1:
            per_byte = max(per_byte, 2.0 / (below * lv.path.bandwidth))
        below *= lv.size
    per_channel = net_caps(levels, c)
    nch, _, threads = channel_count(levels, c)
    if per_channel:  # tuning.cc: min(busBw x .92, nChannels x perChMaxTreeBw)
        factor = min(factor, per_channel[1].tree / per_channel[0])
    out = []
    for row in common(levels):
        # NCCL picks the tree's protocol factor by node count, i.e. by the outermost level
        frac = row[top].tree_bandwidth_fraction
        if row[0].name == "LL128" and per_channel:  # and nChannels x perChMaxTreeLL128Bw
            frac = min(frac, per_channel[1].tree_ll128 / (per_channel[0] * factor))
        intra, inter = latencies(levels, row, c, tree=True)
        depth = (c.ppn - 1) * intra + (c.nodes.bit_length() - 1) * inter
        a = max(p.base_latency_us for p in row) * 1e-6 + 2 * depth
        corr = tuner.TREE_CORRECTION.get(row[0].name) if levels[-1].path.kind else None
        b = per_byte / (factor * frac)
        if _ll(row[0]):  # NCCL's tree algorithm bandwidth is half its bus bandwidth
            b = max(b, 2.0 / _ll_cap(levels, c))
        unit = tuner.channel_bytes("tree", row[0].name, c.n, False, threads)
        out.append(Line(a, b, corr, "tree", row[0].name, nch, unit))
    return out
