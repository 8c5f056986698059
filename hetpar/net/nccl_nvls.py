"""NCCL's NVLS, NVLS_TREE and PAT as (algorithm, protocol) lines its tuner prices.

The same model as ``hetpar.net.nccl`` (NVIDIA/nccl src/graph/tuning.cc, ``ncclTopoTuneModel``),
for the algorithms that need an NVSwitch with NVLink SHARP, or one GPU per node.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.net import tuner
from hetpar.net.nccl import (
    Level,
    Line,
    Op,
    capacity,
    comm_of,
    common,
    is_simple,
    latencies,
    net_caps,
    outer,
    ring_lines,
)


def nvls_lines(levels: Sequence[Level], op: Op) -> list[Line]:
    """NVLink SHARP all-reduce inside one NVSwitch domain (Simple only; tuning.cc): the switch
    reduces, so NCCL prices bus bandwidth x 2 ("AllReduce pipelines two operations") x the
    fabric's nvlsEfficiency, converted to algorithm bandwidth at n / (2(n-1)); its latency
    is hwLat[NVLINK][NVLS] alone.
    Across nodes NVLS needs CollNet (off by default), so it is not offered there."""
    kind = levels[0].path.kind
    if op != "all_reduce" or kind is None or not kind.nvls_efficiency:
        return []
    c = comm_of(levels)
    if c.nodes > 1 or any(lv.size > 1 for lv in levels[1:]):
        return []
    cap = capacity(levels) * 2 * kind.nvls_efficiency * c.n / (2 * (c.n - 1))
    return [Line(tuner.NVLS_LATENCY_S, 1 / cap, None, "nvls", "Simple")]


def nvls_tree_lines(levels: Sequence[Level], op: Op) -> list[Line]:
    """NCCL's NVLS_TREE all-reduce across nodes whose GPUs share an NVSwitch (Simple only;
    tuning.cc): NVLink SHARP inside each node, a tree between the nodes. Its network bandwidth
    is doubled on two nodes ("Handle 2 node case of NVLSTree": each node sends S, not 2 S).
    Bytes: per GPU 2(k-1)/k S at 2 x nvls_efficiency x the NVLink rate inside (k ranks per
    node, as ``nvls_lines``), S (two nodes) or 2 S per node over its NICs (a channel capped
    at perChMaxNVLSTreeBw, ``nccl.net_caps``). Latency:
    hwLat[NVLINK][NVLS_TREE] 25 us + 2 log2(nodes) x the network hop, at NCCL's NVLS_TREE
    network latency (20.9 us) over its tree's (14 us)."""
    kind = levels[0].path.kind
    if op != "all_reduce" or kind is None or not kind.nvls_efficiency:
        return []
    c = comm_of(levels)
    inner = [i for i, lv in enumerate(levels) if lv.size > 1 and not outer(levels, i)]
    if c.nodes < 2 or inner != [0]:
        return []
    k = levels[0].size
    per_byte = 2 * (k - 1) / k / (levels[0].path.bandwidth * 2 * kind.nvls_efficiency)
    # tuning.cc: a channel's network bandwidth (doubled on two nodes) is capped at
    # perChMaxNVLSTreeBw; the cap over the doubled speed slows the NIC term
    per_channel = net_caps(levels, c)
    slow = 1.0
    if per_channel and per_channel[1].nvls_tree:
        speed = per_channel[0] * (2 if c.nodes == 2 else 1)
        slow = max(1.0, speed / per_channel[1].nvls_tree)
    below = 1
    for i, lv in enumerate(levels):
        if lv.size > 1 and outer(levels, i):
            sent = 1.0 if c.nodes == 2 else 2.0
            per_byte = max(per_byte, sent * slow / (below * lv.path.bandwidth))
        below *= lv.size
    simple = [r for r in common(levels) if is_simple(r[0])]
    if not simple:
        return []
    _, inter = latencies(levels, simple[0], c, tree=True)
    a = tuner.NVLS_LATENCY_S + 2 * (c.nodes.bit_length() - 1) * inter * tuner.NVLS_TREE_NET_RATIO
    return [Line(a, per_byte, None, "nvls_tree", "Simple")]


def pat_lines(levels: Sequence[Level], op: Op) -> list[Line]:
    """NCCL's PAT all-gather / reduce-scatter, one GPU per node only, Simple (tuning.cc):
    latency 8 us + log2(nodes) x interLat / 3.5 + n x 2.8 us, bandwidth 0.75 x the ring's."""
    if op not in ("all_gather", "reduce_scatter"):
        return []
    c = comm_of(levels)
    if c.ppn != 1 or c.nodes < 2 or not any(lv.path.kind for lv in levels):
        return []
    ring = [ln for ln in ring_lines(levels, op) if ln.protocol == "Simple"]
    simple = [r for r in common(levels) if is_simple(r[0])]
    if not ring or not simple:
        return []
    _, inter = latencies(levels, simple[0], c, tree=False)
    a = tuner.PAT_BASE_S + (c.nodes.bit_length() - 1) * inter / tuner.PAT_LOG_DIVISOR \
        + c.n * tuner.PAT_PER_RANK_S
    return [Line(a, ring[0].b / tuner.PAT_BANDWIDTH, None, "pat", "Simple")]
