"""Collective algorithms as data plus an alpha-beta cost each: ring, tree, hierarchical, split.

A communicator is a list of ``Level``s, innermost first: ``size`` units of the level below
(ranks at level 0) joined by ``path``. Every cost is NCCL's own model (src/graph/tuning.cc):
``time = base latency + steps x hop latency + bytes on the busiest link / bandwidth``, with the
protocol (LL, LL128, Simple) that is fastest for the message, as NCCL's tuner picks it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def _common(levels: Sequence[Level]) -> list[list[Protocol]]:
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


def _capacity(levels: Sequence[Level]) -> float:
    """A level's boundary is crossed by as many rings (channels) as there are ranks below
    it, so its capacity is that many times its per-GPU bandwidth; the smallest one paces."""
    below, cap = 1, math.inf
    for lv in levels:
        if lv.size > 1:
            cap = min(cap, below * lv.path.bandwidth)
        below *= lv.size
    return cap


def ring_lines(levels: Sequence[Level], op: Op) -> list[tuple[float, float]]:
    """NCCL ring over all ranks, ordered unit by unit, one channel per rank of a unit, as
    (seconds, seconds per byte) per protocol: time = a + b x bytes.

    Each rank sends (n-1)/n of the data per phase (Patarasuk & Yuan 2009) at the smallest
    level capacity; every step waits for the slowest hop.
    """
    n = math.prod(lv.size for lv in levels)
    phases = _phases(op)
    cap = _capacity(levels)
    out = []
    for row in _common(levels):
        frac = min(p.bandwidth_fraction for p in row)
        hop = max(_hop(lv, p) for lv, p in zip(levels, row, strict=True) if lv.size > 1)
        a = max(p.base_latency_us for p in row) * 1e-6 + phases * (n - 1) * hop
        out.append((a, phases * (n - 1) / n / (cap * frac)))
    return out


def tree_lines(levels: Sequence[Level], op: Op) -> list[tuple[float, float]]:
    """NCCL double binary tree across nodes, a chain inside them (all-reduce only), per
    protocol as (a, b). Every rank receives and sends the whole message once up and once
    down (Sanders et al. 2009), at the link kind's ``tree_bandwidth`` x the ring's
    bandwidth x the protocol's ``tree_bandwidth_fraction``; latency is a chain through each
    unit plus log2 of the nodes, both ways.
    """
    if op != "all_reduce":
        return []
    cap = _capacity(levels)
    factor = levels[-1].path.kind.tree_bandwidth if levels[-1].path.kind else 1.0
    top = max(i for i, lv in enumerate(levels) if lv.size > 1)
    out = []
    for row in _common(levels):
        # NCCL picks the tree's protocol factor by node count, i.e. by the outermost level
        frac = row[top].tree_bandwidth_fraction
        depth = 0.0
        for i, (lv, p) in enumerate(zip(levels, row, strict=True)):
            if lv.size <= 1:
                continue
            across = lv.path.kind.scale_out if lv.path.kind else i == len(levels) - 1
            steps = lv.size.bit_length() - 1 if across else lv.size - 1
            depth += steps * _hop(lv, p, tree=True)
        a = max(p.base_latency_us for p in row) * 1e-6 + 2 * depth
        out.append((a, 2 / (factor * cap * frac)))
    return out


def _best_line(lines: Sequence[tuple[float, float]], nbytes: float) -> float:
    return min((a + b * nbytes for a, b in lines), default=math.inf)


def ring(levels: Sequence[Level], op: Op, nbytes: float) -> float:
    """Seconds of NCCL's ring (see ``ring_lines``) on its fastest protocol."""
    if math.prod(lv.size for lv in levels) <= 1 or nbytes <= 0:
        return 0.0
    return _best_line(ring_lines(levels, op), nbytes)


def tree(levels: Sequence[Level], op: Op, nbytes: float) -> float:
    """Seconds of NCCL's double binary tree (see ``tree_lines``); inf but for all-reduce."""
    if op != "all_reduce":
        return math.inf
    if math.prod(lv.size for lv in levels) <= 1 or nbytes <= 0:
        return 0.0
    return _best_line(tree_lines(levels, op), nbytes)


def nccl_lines(levels: Sequence[Level], op: Op) -> list[tuple[float, float]]:
    """Every (algorithm, protocol) NCCL's tuner chooses from, as (a, b) lines."""
    return ring_lines(levels, op) + tree_lines(levels, op)


def nccl_choice(levels: Sequence[Level], op: Op, nbytes: float) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's tuner picks for ``nbytes``: the lowest a + b x bytes."""
    rows = [r[0].name for r in _common(levels)]
    named = [("ring", n, line) for n, line in zip(rows, ring_lines(levels, op), strict=True)]
    named += [("tree", n, line) for n, line in zip(rows, tree_lines(levels, op), strict=False)]
    algo_name, proto, _ = min(named, key=lambda t: t[2][0] + t[2][1] * nbytes)
    return algo_name, proto


def nccl(levels: Sequence[Level], op: Op, nbytes: float) -> float:
    """What NCCL picks: the cheaper of ring and tree under its own cost model."""
    if math.prod(lv.size for lv in levels) <= 1 or nbytes <= 0:
        return 0.0
    return _best_line(nccl_lines(levels, op), nbytes)


def hierarchical(levels: Sequence[Level], op: Op, nbytes: float) -> float:
    """Reduce-scatter level by level inwards-out, all-reduce across the top, all-gather back.

    Level i moves only the 1/(size of everything below) shard each rank holds (Jia et al.
    2018, 2D all-reduce; the same decomposition across heterogeneous groups sends only shards
    over the slow link). Each level is its own NCCL call with its own protocol choice.
    """
    t, shard = 0.0, nbytes
    for lv in levels:
        if lv.size > 1:
            t += nccl([lv], op, shard)
            shard /= lv.size
    return t


def split(costs: Sequence[Callable[[float], float]], nbytes: float) -> float:
    """Split ``nbytes`` over parallel paths so all finish together (seed paper, Wu et al. 2025).

    Each path's cost is taken as affine, a + b x (the line through its cost of one byte and of
    ``nbytes``). The optimum of max_i(a_i + b_i x_i) with sum x_i = nbytes equalises the
    finishing times over the paths it uses; a path whose fixed cost alone exceeds that time
    carries nothing. The split is then priced with the true costs, and the best single path
    is a candidate too, so a split is never slower than its best single path.
    """
    if nbytes <= 0:
        return 0.0
    single = min((c(nbytes) for c in costs), default=math.inf)
    lines = []
    for i, c in enumerate(costs):
        one, full = c(1.0), c(nbytes)
        if math.isfinite(full) and nbytes > 1 and full > one:
            b = (full - one) / (nbytes - 1)
            lines.append((one - b, b, i))
    lines.sort()
    best = single
    for m in range(2, len(lines) + 1):  # the m paths with the smallest fixed cost
        use = lines[:m]
        t = (nbytes + sum(a / b for a, b, _ in use)) / sum(1 / b for _, b, _ in use)
        if any(t < a for a, _, _ in use):
            continue
        shares = [(t - a) / b for a, b, _ in use]
        best = min(best, max(costs[i](x) for (_, _, i), x in zip(use, shares, strict=True)))
    return best


ALGORITHMS: dict[str, Callable[[Sequence[Level], Op, float], float]] = {
    "ring": ring,
    "tree": tree,
    "nccl": nccl,
    "hierarchical": hierarchical,
}
"""Single-path algorithms by name; ``split`` combines any of them over parallel paths."""


def all_to_all(levels: Sequence[Level], nbytes: float) -> float:
    """NCCL all-to-all (concurrent sends to every peer): each rank sends (n-1)/n of its data.

    The share of it bound outside a unit of level i-1 crosses level i's links, so level i
    needs (n - ranks below)/n x bytes / its bandwidth; all levels work at once.
    """
    n = math.prod(lv.size for lv in levels)
    if n <= 1 or nbytes <= 0:
        return 0.0
    below, t, lat, base = 1, 0.0, 0.0, 0.0
    for lv in levels:
        if lv.size > 1:
            kind = lv.path.kind
            t = max(t, (n - below) / n * nbytes / lv.path.bandwidth)
            lat = max(lat, lv.path.latency)
            base = max(base, kind.simple.base_latency_us * 1e-6 if kind else 0.0)
        below *= lv.size
    return base + lat + t
