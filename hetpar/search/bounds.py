"""Upper bounds on a candidate's throughput from proven pipeline lines (fill included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

# Why the lines below are lower bounds on a replica's pipeline time (the schedule's own
# definition, ``hetpar/schedules``: every rank runs its action list in order, one action at a
# time, and a chunk's forward needs the previous chunk's forward of that micro-batch, its
# backward the next chunk's backward). Model chunk ``j * pp + q`` sits on rank q
# (``split.chunk_ranges``), so rank c's first chunk is the c-th chunk of the model:
#   - rank c's first action is a forward of its first chunk, which waits for that
#     micro-batch's forwards through the first chunks of ranks 0..c-1;
#   - its last B is of its first chunk, and the backwards of ranks c-1..0's first chunks of
#     that micro-batch follow it (schedules that split B from W may end a rank on a W,
#     which nothing follows: for them no fill is counted);
#   - in between, rank c runs its own k micro-batches, ``k t_c``.
# So pipeline(k) >= k t_c + f sum_{q<c} n_q tau_q for every rank c, with n_q layers of time
# tau_q (forward + backward) on rank q, t_c = n_c tau_c + e_c (e: embedding, head, p2p), and
# f = 1/vpp (a rank's first chunk holds ceil(n_q / vpp) >= n_q / vpp of its layers) or 0.
# Any convex combination sum_c lam_c (...) of these lines is then a line k A + B below the
# pipeline; over all splits (n_q >= vpp, sum n_q = L) and k >= k0 it is at least
# k min A + (min (k0 A + B) - k0 min A), as k A + B = (k - k0) A + (k0 A + B). The schedule
# formula ``(k - a) max + b sum`` (``pipeline_weights``) is no such bound: on uneven
# pipelines a slow rank's warm-up hides the others' fill, and an interleaved 70B plan on
# hetero-1024 ran 5% under it (``bench/search_speed.py``, 1 bound violation).


class ClassBound(NamedTuple):
    """One replica class: with k micro-batches (k >= the least share) a replica's pipeline
    takes at least ``slope * k + offset`` seconds, and ``tail`` more after it (gradient
    sync, optimizer step) at least."""

    replicas: int
    slope: float
    offset: float = 0.0
    tail: float = 0.0


def least_makespan(classes: Sequence[ClassBound], microbatches: int, least_share: int) -> float:
    """A lower bound on the iteration's makespan over all shares of ``microbatches``.

    Every replica takes at least ``least_share`` micro-batches (the share solver and
    polishing never go below one share unit) and the shares sum to ``microbatches``. A
    makespan T lets a replica take at most ``(T - offset - tail) / slope`` of them, so T needs
    ``sum_c count_c (T - offset_c - tail_c) / slope_c >= microbatches`` and
    ``T >= least_share slope_c + offset_c + tail_c`` for every class; the least such T.
    """
    inv = extra = floor = 0.0
    for c in classes:
        inv += c.replicas / c.slope
        extra += c.replicas * (c.offset + c.tail) / c.slope
        floor = max(floor, least_share * c.slope + c.offset + c.tail)
    return max((microbatches + extra) / inv, floor)


def relax_weights(taus: Sequence[float]) -> tuple[float, ...]:
    """Rank weights proportional to 1/tau: their line's slope is the same for every split
    (the continuous relaxation ``(L + sum e/tau) / sum 1/tau`` of the slowest rank)."""
    inv = [1.0 / t for t in taus]
    s = sum(inv)
    return tuple(x / s for x in inv)


def equal_weights(taus: Sequence[float], k: int, fill: float) -> tuple[float, ...]:
    """Rank weights under which every layer costs the same wherever it sits at k micro-batches
    (``tau_q (k lam_q + fill Lambda_{>q})`` equal for all q; clamped at 0), so no split escapes
    the fill. Without fill they are ``relax_weights``."""
    lam = [0.0] * len(taus)
    later = 0.0
    for q in range(len(taus) - 1, -1, -1):
        lam[q] = max(0.0, (1.0 / taus[q] - fill * later) / k)
        later += lam[q]
    return tuple(x / later for x in lam)


def line_over_splits(lam: Sequence[float], taus: Sequence[float], extras: Sequence[float],
                     n_layers: int, min_layers: int, k0: int, fill: float
                     ) -> tuple[float, float]:
    """``(slope, offset)`` of the lam-combination of the rank lines, valid for every split
    with at least ``min_layers`` layers a rank and every k >= k0 (see the module comment)."""
    later = [0.0] * len(lam)
    for q in range(len(lam) - 2, -1, -1):
        later[q] = later[q + 1] + lam[q + 1]
    e = sum(x * y for x, y in zip(lam, extras, strict=True))
    slope = e + _least(n_layers, min_layers, [t * x for t, x in zip(taus, lam, strict=True)])
    at_k0 = k0 * e + _least(n_layers, min_layers, [
        t * (k0 * x + fill * lt) for t, x, lt in zip(taus, lam, later, strict=True)])
    return slope, max(0.0, at_k0 - k0 * slope)


def line_at_split(lam: Sequence[float], taus: Sequence[float], layers: Sequence[int],
                  rank_times: Sequence[float], fill: float) -> tuple[float, float]:
    """``(slope, offset)`` of the lam-combination of the rank lines for one split."""
    slope = sum(x * t for x, t in zip(lam, rank_times, strict=True))
    offset, later = 0.0, 0.0
    for q in range(len(lam) - 1, -1, -1):
        offset += fill * later * layers[q] * taus[q]
        later += lam[q]
    return slope, offset


def best_rank_line(taus: Sequence[float], layers: Sequence[int], rank_times: Sequence[float],
                   fill: float, k: int) -> tuple[float, float]:
    """The single rank line ``(t_c, fill sum_{q<c} n_q tau_q)`` largest at k micro-batches."""
    best, line, before = -1.0, (rank_times[0], 0.0), 0.0
    for t, n, tau in zip(rank_times, layers, taus, strict=True):
        if k * t + before > best:
            best, line = k * t + before, (t, before)
        before += fill * n * tau
    return line


def _least(n_layers: int, min_layers: int, per_layer: Sequence[float]) -> float:
    """Least ``sum n_q c_q`` over n_q >= min_layers, sum n_q = n_layers (relaxed)."""
    return min_layers * sum(per_layer) + max(0, n_layers - len(per_layer) * min_layers) * min(
        per_layer)
