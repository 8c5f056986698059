"""Collective algorithms by name: NCCL's choice (``hetpar.net.nccl``), hierarchical, split.

NCCL's algorithms (ring, double binary tree, NVLS, PAT) on each protocol (LL, LL128, Simple) are
lines ``time = latency + bytes / bandwidth`` in ``hetpar.net.nccl``; as NCCL's tuner does, the
default takes the cheapest for the message; hetpar's own algorithms compose those costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from hetpar.net import tuner
from hetpar.net.nccl import Level, Line, Op, Path, comm_of, ring_lines, tree_lines
from hetpar.net.nccl_nvls import nvls_lines, nvls_tree_lines, pat_lines

__all__ = ["ALGORITHMS", "Level", "Line", "Op", "Path", "all_to_all", "hierarchical", "nccl",
           "nccl_choice", "nccl_lines", "ring", "ring_lines", "split", "tree", "tree_lines"]


def _best_line(lines: Sequence[Line], nbytes: float) -> float:
    """Seconds of the line NCCL's tuner picks for ``nbytes``, as NCCL runs it (``Line.run``:
    the tuner picks assuming every channel; a medium message then runs on fewer)."""
    if not lines:
        return math.inf
    return min(lines, key=lambda ln: ln.time(nbytes)).run(nbytes)


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


def _forced(lines: Callable[[Sequence[Level], Op], list[Line]]) -> Callable[
        [Sequence[Level], Op, float], float]:
    def cost(levels: Sequence[Level], op: Op, nbytes: float) -> float:
        if math.prod(lv.size for lv in levels) <= 1 or nbytes <= 0:
            return 0.0
        return _best_line(lines(levels, op), nbytes)
    return cost


def nccl_lines(levels: Sequence[Level], op: Op,
               version: tuple[int, int] | None = None) -> list[Line]:
    """Every (algorithm, protocol) NCCL's tuner chooses from by default (CollNet is off
    unless NCCL_COLLNET_ENABLE is set, so it is not offered); ``version``: an older NCCL,
    without what it had not yet (LL128 and the single-node tree before 2.5, NVLS before 2.17,
    PAT before 2.23)."""
    trees = tree_lines(levels, op)
    if comm_of(levels).nodes == 1 and not tuner.offered(tuner.TREE_ONE_NODE, version):
        trees = []  # NCCL before 2.5 runs no tree inside one node (tuner.INTRODUCED)
    lines = (ring_lines(levels, op) + trees + nvls_lines(levels, op)
             + nvls_tree_lines(levels, op) + pat_lines(levels, op))
    if version is not None and version < tuner.CHANNEL_TUNING:
        lines = [ln._replace(unit=0.0) for ln in lines]  # 2.4's own rule: not modelled
    return [ln for ln in lines
            if tuner.offered(ln.algorithm, version) and tuner.offered(ln.protocol, version)]


def nccl_choice(levels: Sequence[Level], op: Op, nbytes: float,
                version: tuple[int, int] | None = None) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's tuner picks for ``nbytes``: the lowest time."""
    best = min(nccl_lines(levels, op, version), key=lambda ln: ln.time(nbytes))
    return best.algorithm, best.protocol


def nccl(levels: Sequence[Level], op: Op, nbytes: float,
         version: tuple[int, int] | None = None) -> float:
    """What NCCL picks: the cheapest (algorithm, protocol) under its own cost model."""
    if math.prod(lv.size for lv in levels) <= 1 or nbytes <= 0:
        return 0.0
    return _best_line(nccl_lines(levels, op, version), nbytes)


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
    "nvls": _forced(nvls_lines),
    "nvls_tree": _forced(nvls_tree_lines),
    "pat": _forced(pat_lines),
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
