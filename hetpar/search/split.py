"""Exact layer split across uneven pipeline ranks (dynamic programming) and batch shares."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hetpar.specs.stage import split_layers

INF = float("inf")


@dataclass(frozen=True, kw_only=True)
class RankCost:
    """One pipeline rank as the DP sees it: per-layer times and the layers memory allows."""

    layer_times: tuple[float, ...]
    """Time of each model layer on this rank (one micro-batch, forward + backward)."""
    extra_s: float = 0.0
    """Embedding (first rank) or head (last rank) time."""
    max_layers: int = 10**9
    """Most layers that fit in this rank's memory."""


@dataclass(frozen=True, kw_only=True)
class Split:
    """Result of the layer split: layers per rank and the stage-time figures it gives."""

    layers: tuple[int, ...]
    rank_times: tuple[float, ...]
    max_time: float
    sum_time: float
    objective: float


def _cost_matrix(rank: RankCost, n: int, min_layers: int) -> np.ndarray:
    """W[i, j] = time of layers [i, j) on ``rank``; inf where the count is not allowed."""
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(rank.layer_times, dtype=float))))
    w = prefix[None, :] - prefix[:, None] + rank.extra_s
    count = np.arange(n + 1)[None, :] - np.arange(n + 1)[:, None]
    bad = (count < min_layers) | (count > rank.max_layers)
    w[bad] = INF
    return w


def _minmax(mats: Sequence[np.ndarray]) -> float:
    """Smallest possible max rank time (bottleneck partition DP, Alpa-style stage DP)."""
    f = mats[0][0].copy()  # first rank starts at layer 0
    for w in mats[1:]:
        f = np.min(np.maximum(f[:, None], w), axis=0)
    return float(f[-1])


def _minsum(mats: Sequence[np.ndarray], cap: float) -> tuple[float, list[int]]:
    """Smallest total rank time with every rank at most ``cap``; returns (sum, cut points)."""
    n = mats[0].shape[0] - 1
    capped = [np.where(w <= cap * (1 + 1e-12), w, INF) for w in mats]
    g = capped[0][0].copy()
    back: list[np.ndarray] = []
    for w in capped[1:]:
        tot = g[:, None] + w
        back.append(np.argmin(tot, axis=0))
        g = np.min(tot, axis=0)
    if not np.isfinite(g[n]):
        return INF, []
    cuts, j = [n], n
    for b in reversed(back):
        j = int(b[j])
        cuts.append(j)
    cuts.append(0)
    return float(g[n]), cuts[::-1]


def split_layers_exact(
    ranks: Sequence[RankCost], a: float = 1.0, b: float = 0.0, min_layers: int = 1
) -> Split | None:
    """Contiguous split of the layers over ``ranks`` minimising ``a*max + b*sum`` exactly.

    Uses the closed form of ``split_linear`` when every rank's layers cost the same (dense
    models), else the dynamic program ``split_layers_dp``; both are exact.
    """
    if all(min(r.layer_times) == max(r.layer_times) for r in ranks):
        return split_linear(ranks, a, b, min_layers)
    return split_layers_dp(ranks, a, b, min_layers)


def _linear_fill(
    t: list[float], e: list[float], hi: list[int], n: int, least: int, order: list[int]
) -> tuple[float, list[int]] | None:
    """Least-sum counts with least <= n_r <= hi_r and sum n: cheapest ranks first."""
    if min(hi) < least or sum(hi) < n:
        return None
    counts = [least] * len(t)
    rest = n - least * len(t)
    for r in order:
        take = min(rest, hi[r] - least)
        counts[r] += take
        rest -= take
    return sum(c * tr + er for c, tr, er in zip(counts, t, e, strict=True)), counts


def split_linear(
    ranks: Sequence[RankCost], a: float = 1.0, b: float = 0.0, min_layers: int = 1
) -> Split | None:
    """Exact split when rank r's time is n_r t_r + e_r (identical layers).

    The least feasible cap M* is found by bisection over the achievable rank times
    {n t_r + e_r}; under a cap M each rank takes at most (M - e_r)/t_r layers, and the
    least total time fills the cheapest ranks first. As in the DP, caps above M* are tried
    in increasing order until ``a*M`` plus the least possible sum cannot win.
    """
    n, p = len(ranks[0].layer_times), len(ranks)
    if p * min_layers > n:
        return None
    t = [r.layer_times[0] for r in ranks]
    e = [r.extra_s for r in ranks]
    caps = [min(r.max_layers, n) for r in ranks]
    order = sorted(range(p), key=lambda r: (t[r], r))

    def hi(m: float) -> list[int]:
        return [min(caps[r], int((m - e[r]) / t[r] * (1 + 1e-12) + 1e-9)) for r in range(p)]

    vals = np.unique(
        np.concatenate(
            [np.arange(min_layers, max(caps[r], min_layers) + 1) * t[r] + e[r] for r in range(p)]
        )
    )
    if _linear_fill(t, e, caps, n, min_layers, order) is None:
        return None
    lo, up = 0, len(vals) - 1
    while lo < up:  # least value whose caps admit a split
        mid = (lo + up) // 2
        if _linear_fill(t, e, hi(float(vals[mid])), n, min_layers, order) is None:
            lo = mid + 1
        else:
            up = mid
    floor = _linear_fill(t, e, caps, n, min_layers, order)
    assert floor is not None
    best: tuple[float, float, list[int]] | None = None
    for v in vals[lo:]:
        cap = float(v)
        if best is not None and a * cap + b * floor[0] >= best[0]:
            break
        res = _linear_fill(t, e, hi(cap), n, min_layers, order)
        if res is None:
            continue
        times = [c * tr + er for c, tr, er in zip(res[1], t, e, strict=True)]
        obj = a * max(times) + b * res[0]
        if best is None or obj < best[0] * (1 - 1e-12):
            best = (obj, res[0], res[1])
        if b == 0:
            break
    assert best is not None
    obj, total, counts = best
    times_t = tuple(c * tr + er for c, tr, er in zip(counts, t, e, strict=True))
    return Split(
        layers=tuple(counts),
        rank_times=times_t,
        max_time=max(times_t),
        sum_time=total,
        objective=obj,
    )


def split_layers_dp(
    ranks: Sequence[RankCost], a: float = 1.0, b: float = 0.0, min_layers: int = 1
) -> Split | None:
    """Contiguous split of the layers over ``ranks`` minimising ``a*max + b*sum`` exactly.

    The bottleneck DP gives the least max rank time M*; then for each achievable cap
    M >= M* in increasing order a min-sum DP under the cap, stopping once ``a*M`` plus the
    least possible sum cannot beat the best found. With ``b = 0`` this is the classic min-max
    partition. ``None`` when no split fits (too few layers or memory).
    """
    n = len(ranks[0].layer_times)
    mats = [_cost_matrix(r, n, min_layers) for r in ranks]
    mstar = _minmax(mats)
    if not np.isfinite(mstar):
        return None
    caps = [mstar]
    if b > 0 and len(ranks) > 1:
        vals = np.unique(np.concatenate([w[np.isfinite(w)] for w in mats]))
        caps += [float(v) for v in vals[vals > mstar * (1 + 1e-12)]]
    floor_sum, _ = _minsum(mats, INF)
    best: tuple[float, float, list[int]] | None = None
    for cap in caps:
        if best is not None and a * cap + b * floor_sum >= best[0]:
            break
        s, cuts = _minsum(mats, cap)
        if not cuts:
            continue
        real_max = max(float(mats[r][cuts[r], cuts[r + 1]]) for r in range(len(ranks)))
        obj = a * real_max + b * s
        if best is None or obj < best[0] * (1 - 1e-12):
            best = (obj, s, cuts)
    assert best is not None
    obj, s, cuts = best
    times = tuple(float(mats[r][cuts[r], cuts[r + 1]]) for r in range(len(ranks)))
    layers = tuple(cuts[r + 1] - cuts[r] for r in range(len(ranks)))
    return Split(layers=layers, rank_times=times, max_time=max(times), sum_time=s, objective=obj)


def chunk_ranges(layers_per_rank: Sequence[int], vpp: int) -> list[tuple[int, int]]:
    """Model-order layer ranges of the ``pp * vpp`` chunks; chunk ``c*pp + r`` is on rank r.

    Each rank's layers are divided as evenly as possible over its ``vpp`` chunks.
    """
    pp = len(layers_per_rank)
    sizes = [[n // vpp + (1 if c < n % vpp else 0) for c in range(vpp)] for n in layers_per_rank]
    out, start = [], 0
    for c in range(vpp):
        for r in range(pp):
            out.append((start, start + sizes[r][c]))
            start += sizes[r][c]
    return out


def batch_shares(
    replica_time: Sequence[Callable[[int], float]], units: int
) -> tuple[list[int], float] | None:
    """Integral micro-batch counts per replica minimising the slowest replica's time.

    Each replica gets one micro-batch, then every further one goes to the replica whose
    time after taking it is least (ties: lowest index). For non-decreasing time functions
    this greedy is optimal: it takes the ``units`` smallest increments in merged order.
    Returns ``(counts, max time)`` or ``None`` when there are fewer units than replicas.
    """
    d = len(replica_time)
    if units < d:
        return None
    counts = [1] * d
    heap = [(replica_time[r](2), r) for r in range(d)]
    heapq.heapify(heap)
    for _ in range(units - d):
        _, r = heapq.heappop(heap)
        counts[r] += 1
        heapq.heappush(heap, (replica_time[r](counts[r] + 1), r))
    return counts, max(replica_time[r](counts[r]) for r in range(d))


def fixed_split(ranks: list[RankCost], n_layers: int, vpp: int) -> Split | None:
    """Megatron's equal split (uniform plans): per-rank layers of the equal chunks."""
    pp = len(ranks)
    chunks = split_layers(n_layers, pp * vpp)
    layers = [sum(b - a for j, (a, b) in enumerate(chunks) if j % pp == r) for r in range(pp)]
    if any(n > rc.max_layers for n, rc in zip(layers, ranks, strict=True)):
        return None
    times = tuple(n * rc.layer_times[0] + rc.extra_s for n, rc in zip(layers, ranks, strict=True))
    return Split(
        layers=tuple(layers),
        rank_times=times,
        max_time=max(times),
        sum_time=sum(times),
        objective=0.0,
    )
