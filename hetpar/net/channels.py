"""NCCL's per-channel speed across nodes and its per-channel bandwidth caps, by architecture.

NCCL runs a collective on ``nChannels`` channels of ``bw`` GB/s each (its topology search,
``src/graph/search.cc``), and its tuner prices bus bandwidth as nChannels x bw, then caps
some (algorithm, protocol) pairs at nChannels x a per-channel maximum that depends on the GPU
architecture and on the node count (``src/graph/tuning.cc``, ``perChMax*Bws``). Since the caps
and the bandwidth share the factor nChannels, a cap is a ratio: cap / bw of one channel.

Across nodes, the ring search puts one channel on each NIC at the fastest entry of the
architecture's ``speedArrayInter`` the NIC carries, and ``ncclTopoDupChannels`` doubles the
channels (halving bw) when bw >= 25 GB/s, except above compute capability 8.0 below 50 GB/s
with more than 4 channels. Inside one node the search's speeds (after duplication: about 20 GB/s on
Volta / Ampere NVLink, 30 on Hopper, 45 on Blackwell) stay below every cap but Blackwell's
ring LL128 (40 of 0.92 x 45, 3%), so only communicators that span nodes are capped here.
Every value: NVIDIA/nccl @ 5067397c2676d5aed50042fc39e5c8ee96eb0027.
"""

from __future__ import annotations

from typing import NamedTuple

SPEEDS_INTER: dict[str, tuple[float, ...]] = {
    # search.cc speedArrayInter (before sm90), sm90SpeedArrayInter, sm100SpeedArrayInter (GB/s)
    "volta": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
              3.0, 2.4, 1.2, 0.24, 0.12),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
               1.2, 0.24, 0.12),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0,
                  12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}
SPEEDS_INTER["ampere"] = SPEEDS_INTER["volta"]
SPEEDS_INTRA: dict[str, tuple[float, ...]] = {
    # search.cc speedArrayIntra (before sm90), sm90SpeedArrayIntra, sm100SpeedArrayIntra (GB/s)
    "volta": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTRA["ampere"] = SPEEDS_INTRA["volta"]

MAX_SEARCH_CHANNELS = 32
"""init.cc: ringGraph->maxChannels = MAXCHANNELS / 2 (the search and its duplication)."""
MAX_CHANNELS = 64
"""device.h MAXCHANNELS: connect.cc's doubling of the search's channels stops here."""

DUP_MIN_GBYTE_S = 25.0
"""search.cc ncclTopoDupChannels: no duplication below 25 GB/s per channel."""
DUP_MIN_HOPPER_GBYTE_S = 50.0
"""... and on compute capability > 8.0, none below 50 GB/s when there are more than 4 channels."""


class Caps(NamedTuple):
    """Per-channel maxima (GB/s) of one architecture at one node count (tuning.cc)."""

    tree: float
    """perChMaxTreeBws: the tree's all-reduce bus bandwidth, any protocol."""
    ring_ll128: float
    """perChMaxRingLL128Bws."""
    tree_ll128: float
    """perChMaxTreeLL128Bws."""
    nvls_tree: float
    """perChMaxNVLSTreeBws (0 where NCCL has no NVLS_TREE)."""


# tuning.cc tables, per architecture: (N1, N2, N4) columns = 1 node, 2 nodes, more
_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
         "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
_RING_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
               "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0)}
_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
               "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
_NVLS_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
              "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}


def architecture(arch: int) -> str | None:
    """NCCL's compute-capability class (tuning.cc compCapIndex) of ``arch`` = major x 10 +
    minor of the slowest GPU (NCCL's minCompCap); None when unknown (0) or before Volta."""
    if arch >= 100:
        return "blackwell"
    if arch >= 90:
        return "hopper"
    if arch >= 80:
        return "ampere"
    return "volta" if arch >= 70 else None


def arch_of(compute_capability: str) -> int:
    """``"8.0"`` as NCCL's compCap 80 (major x 10 + minor); 0 for an empty string."""
    if not compute_capability:
        return 0
    major, minor = compute_capability.split(".")
    return int(major) * 10 + int(minor)


def caps(arch: int, nodes: int) -> Caps | None:
    """The per-channel maxima NCCL applies to a communicator over ``nodes`` nodes of GPUs of
    compute capability ``arch`` (tuning.cc index2: 1, 2, more nodes); None if unknown."""
    name = architecture(arch)
    if name is None:
        return None
    i = 0 if nodes <= 1 else 1 if nodes == 2 else 2
    return Caps(_TREE[name][i], _RING_LL128[name][i], _TREE_LL128[name][i], _NVLS_TREE[name][i])


def net_speed(line_gbyte_s: float, arch: int, channels: int) -> float:
    """GB/s of one channel across nodes: the fastest ``speedArrayInter`` entry a NIC of
    ``line_gbyte_s`` carries, halved when ncclTopoDupChannels doubles ``channels`` (the
    channels the search found: one per NIC)."""
    speed = _speed(line_gbyte_s, arch, inter=True)
    return speed / 2 if _duplicated(speed, arch, channels) else speed


def _speed(line_gbyte_s: float, arch: int, inter: bool) -> float:
    """The fastest entry of the architecture's speed array a link of ``line_gbyte_s`` carries
    (search.cc starts there: speedArray[speedIndex] <= maxBw)."""
    table = (SPEEDS_INTER if inter else SPEEDS_INTRA)[architecture(arch) or "volta"]
    return next((s for s in table if s <= line_gbyte_s), table[-1])


def _duplicated(speed: float, arch: int, channels: int) -> bool:
    """Whether ncclTopoDupChannels doubles ``channels`` search channels of ``speed`` GB/s."""
    if speed < DUP_MIN_GBYTE_S:
        return False
    return not (arch > 80 and speed < DUP_MIN_HOPPER_GBYTE_S and channels > 4)


def count(line_gbyte_s: float, arch: int, ranks_per_node: int,
          inter: bool) -> tuple[int, float]:
    """(NCCL's comm->nChannels for ring and tree, the search's bandwidth: its channels x their
    speed, GB/s): the search's channels, each at the speed
    ``_speed`` gives (across nodes one per NIC, i.e. per GPU of a node on rails, ``ranks_per_
    node``; inside a node as many as the GPU's ``line_gbyte_s`` carries), doubled by
    ncclTopoDupChannels (at most ``MAX_SEARCH_CHANNELS``), then doubled again by connect.cc
    ("Duplication should be complete now", at most ``MAX_CHANNELS``). Not modelled: the
    search's pass 2 (bwIntra raised), connect.cc's further doubling on Hopper across nodes
    (bwIntra > 45 GB/s, < 16 channels) and for unpack networking (TCPX/TCPXO, < 16 channels),
    and NCCL_MIN/MAX_NCHANNELS."""
    speed = _speed(line_gbyte_s, arch, inter)
    n = ranks_per_node if inter else max(1, int(line_gbyte_s // speed))
    n = min(n, MAX_SEARCH_CHANNELS)
    found = n * speed
    if _duplicated(speed, arch, n):
        n = min(2 * n, MAX_SEARCH_CHANNELS)
    return min(2 * n, MAX_CHANNELS), found
