"""NCCL's tuning model as data: the constants its tuner prices (algorithm, protocol) pairs with.

Every value is read from NVIDIA/nccl ``src/graph/tuning.cc`` at commit
5067397c2676d5aed50042fc39e5c8ee96eb0027 (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``) unless
its comment says otherwise; the per-link-kind latencies live in ``hetpar/catalog/links``.
"""

from __future__ import annotations

TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    # treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B to 256 MiB: "Trees are not
    # perfectly sticking to the model for medium sizes"; the tree's bandwidth is multiplied
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}
TREE_CORRECTION_SIZES = 23
"""ncclTopoGetAlgoTime applies the table for 0 <= log2(bytes >> 6) < 23."""

RING_PLATEAU = 1.4
"""Ring Simple all-reduce across nodes: latency x 1.4 ("Plateau effect of ring"; x 1.9 before
compute capability 8.0) once bytes / (channels x ranks) >= 64, i.e. whenever Simple can win."""

NET_OVERHEAD_S = 1.0e-6
"""getNetOverhead: 1 us per ring step across nodes on x86 Intel hosts (2 us on AMD hosts),
x 3 on the Simple protocol; an intra-node step of a multi-node ring costs at least this."""

SIMPLE_OVERHEAD_FACTOR = 3.0

PAT_BASE_S = 8.0e-6
"""baseLatencies[PAT] (all protocols)."""
PAT_PER_RANK_S = 2.8e-6
"""PAT's "still a linear part": nRanks x 2.8 us."""
PAT_LOG_DIVISOR = 3.5
"""PAT's log latency: log2(nodes) x interLat / 3.5."""
PAT_BANDWIDTH = 0.75
"""PAT's bus bandwidth x 0.75 of the ring's; PAT runs only with one GPU per node
(ncclPatEnable: nNodes == nRanks) and only for all-gather / reduce-scatter on Simple."""

NVLS_LATENCY_S = 25.0e-6
"""hwLatencies[NVLINK][NVLS][Simple] (NVLS has no LL / LL128 and a zero base latency); the
same 25 us for NVLS_TREE."""

NVLS_TREE_NET_RATIO = 20.9 / 14.0
"""hwLatencies[NET][NVLS_TREE][Simple] 20.9 us over the tree's [NET][TREE][Simple] 14 us: a
path's latency is its Simple tree hop, scaled so."""


def correction(table: tuple[float, ...] | None, nbytes: float) -> float:
    """NCCL's tree correction factor for a message of ``nbytes`` (1.0 outside the table)."""
    if table is None:
        return 1.0
    i = (int(nbytes) >> 6).bit_length() - 1
    return table[i] if 0 <= i < TREE_CORRECTION_SIZES else 1.0


INTRODUCED: dict[str, tuple[int, int]] = {
    # first NCCL release with the protocol / algorithm (NVIDIA/nccl history):
    "LL128": (2, 5),  # 299c554d "2.5.6-1" (2019-11-19)
    "nvls": (2, 17),  # 5d3ab08b "2.17.1-1" (2023-02-27), NVLink SHARP
    "nvls_tree": (2, 18),  # d97a32fa "2.18.1-1" (2023-04-03)
    "pat": (2, 23),  # 68b54236 "2.23.4-1" (2024-09-10)
    # the tree on one node: NCCL 2.4 (v2.4.8-1 src/init.cc ncclTreeThreshold) sets the tree
    # threshold to 0, trees off, when the communicator has fewer than 2 nodes; 2.5.6-1's
    # tuning.cc (299c554d, 2019-11-19) prices the tree on one node over its intra-node links
    "tree_one_node": (2, 5),
}
"""An older library (a cluster's ``nccl_version``) never runs what it does not have."""


TREE_ONE_NODE = "tree_one_node"
"""``INTRODUCED``'s key for NCCL's double binary tree inside a single node."""


def offered(name: str, version: tuple[int, int] | None) -> bool:
    """Whether library ``version`` (None: current) has the protocol or algorithm ``name``."""
    return version is None or version >= INTRODUCED.get(name, (0, 0))


# What NCCL runs a chosen (algorithm, protocol) on, by message size (enqueue.cc
# topoGetAlgoInfo, after the choice): ring and tree drop channels while nBytes < nc x nt x
# threadThreshold (nc >= 2); the tuner's price assumed all of them.
MAX_THREADS: dict[str, int] = {"LL": 512, "LL128": 640, "Simple": 512}
"""tuning.cc maxThreads of ring and tree (device.h NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS,
NCCL_SIMPLE_MAX_NTHREADS); the ring's Simple runs 256 when the search's bwIntra x nChannels
<= PCI_BW (topo.h, 12 GB/s)."""
THREAD_THRESHOLD: dict[str, int] = {"LL": 8, "LL128": 8, "Simple": 64}
"""comm.h NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD, bytes per thread; tuning.cc multiplies the
ring's LL one by nRanks."""
PCI_BW_GBYTE_S = 12.0
"""topo.h PCI_BW ("PCI Gen3 x16")."""
CHANNEL_TUNING = (2, 5)
"""The rule above since 2.5.6-1 (299c554d enqueue.cc getAlgoInfo); NCCL 2.4's LL-mode rule
(v2.4.8-1 getKernelInfo) differs and is not modelled: an older library keeps every channel."""


def channel_bytes(algorithm: str, protocol: str, nranks: int, slow: bool,
                  threads: int = 0) -> float:
    """Bytes one channel needs before NCCL runs another (nt x threadThreshold; 0: the
    algorithm keeps its channels, as NVLS, NVLS_TREE and PAT do: PAT's maxThreads is never
    set, so its threshold is 0). ``slow``: the ring's Simple runs 256 threads (PCI_BW);
    ``threads``: the library's own count on every protocol (RCCL's 256; 0: NCCL's)."""
    if algorithm not in ("ring", "tree") or protocol not in MAX_THREADS:
        return 0.0
    threads = threads or (256 if (slow and algorithm == "ring" and protocol == "Simple")
                          else MAX_THREADS[protocol])
    ranks = nranks if (algorithm == "ring" and protocol == "LL") else 1
    return float(threads * THREAD_THRESHOLD[protocol] * ranks)


def channels_run(nbytes: float, channels: int, unit: float) -> int:
    """Channels NCCL runs for ``nbytes``: from ``channels``, one fewer while nbytes <
    nc x ``unit`` and nc >= 2 (enqueue.cc), i.e. floor(nbytes / unit) within [1, channels]."""
    if unit <= 0 or nbytes >= channels * unit:
        return channels
    return max(1, min(channels, int(nbytes // unit)))
