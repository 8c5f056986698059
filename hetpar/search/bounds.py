"""Upper bounds on a candidate's throughput from proven pipeline lines (fill included)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from hetpar import schedules
from hetpar.search.candidates import ClassCost, Knobs
from hetpar.search.costmodel import StageCost
from hetpar.search.structures import ReplicaClass, Structure

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


Lines = tuple[tuple[float, float], tuple[float, float]]


class ClassLines:
    """The lines above for each replica class, built from the coster's stage costs and extras
    (both cached there) and cached here by what they depend on."""

    def __init__(
        self,
        stage: Callable[[str, int, Knobs], StageCost],
        extras: Callable[[ReplicaClass, Knobs], list[float]],
        n_layers: int,
    ) -> None:
        self.stage, self.extras, self.n_layers = stage, extras, n_layers
        self._inv: dict[tuple[object, ...], float] = {}
        self._wts: dict[tuple[object, ...], tuple[list[float], tuple[float, ...],
                                                tuple[float, ...]]] = {}
        self._line: dict[tuple[object, ...], Lines] = {}

    def group_makespan(self, s: Structure, k: Knobs, sched: str, m: int, k0: int,
                       total: int) -> float:
        """Least makespan of ``total`` micro-batches under schedule ``sched`` over every split
        and share: three lines per class, each solved alone and the largest kept (k times
        the slowest rank at least, ``class_lb``, and the 1/tau- and equal-cost combinations
        of the rank lines, which keep some pipeline fill)."""
        kv = k._replace(schedule=sched)
        plain, relax, equal = [], [], []
        for c in s.classes:
            lines = self.lines(c, kv, m, k0)
            plain.append(ClassBound(replicas=c.count, slope=self.class_lb(c, k)))
            relax.append(ClassBound(c.count, *lines[0]))
            equal.append(ClassBound(c.count, *lines[1]))
        return max(least_makespan(rows, total, k0) for rows in (plain, relax, equal))

    def split_makespan(self, classes: Sequence[ClassCost], k: Knobs, m: int, k0: int,
                       total: int, tails: Sequence[float], equal_shares: bool) -> float:
        """Least makespan once the splits are known: the lines of ``group_makespan`` on them,
        each plus the class's tail, and the one rank line largest at the nominal share
        ``m`` (``bounds.best_rank_line``); with equal shares every replica runs ``m``."""
        kinds: list[list[ClassBound]] = [[], [], [], []]
        for cc, tl in zip(classes, tails, strict=True):
            c, sp = cc.cls, cc.split
            taus, w, eq = self.weights(c, k, m)
            f = self.fill(c, k)
            kinds[0].append(ClassBound(c.count, sp.max_time, 0.0, tl))
            kinds[1].append(ClassBound(c.count, *line_at_split(w, taus, sp.layers,
                                                               sp.rank_times, f), tl))
            kinds[2].append(ClassBound(c.count, *line_at_split(eq, taus, sp.layers,
                                                               sp.rank_times, f), tl))
            kinds[3].append(ClassBound(c.count, *best_rank_line(taus, sp.layers,
                                                                sp.rank_times, f, m), tl))
        if equal_shares:
            # equal shares: every replica runs m; the rank line largest at m is the best line
            return max(m * r.slope + r.offset + r.tail for r in kinds[3] + kinds[0])
        return max(least_makespan(rows, total, k0) for rows in kinds)

    def fill(self, c: ReplicaClass, k: Knobs) -> float:
        """Weight of a rank's layers in the pipeline fill of the ranks after it (``bounds``):
        1/vpp, or 0 where the schedule may end a rank on a deferred W."""
        if c.pp == 1 or schedules.traits(k.schedule).splits_backward:
            return 0.0
        return 1.0 / k.vpp

    def weights(self, c: ReplicaClass, k: Knobs, m: int
                ) -> tuple[list[float], tuple[float, ...], tuple[float, ...]]:
        """Per-layer rank times and the two rank weightings of ``group_makespan`` (cached;
        the refined bound must use the very same weights)."""
        f = self.fill(c, k)
        key = (c.ranks, k.cp, k.micro_batch, k.sequence_parallel, k.recompute, m, f, k.axes)
        hit = self._wts.get(key)
        if hit is None:
            taus = [self.stage(slot.group, slot.tp, k).layer_time_s for slot in c.ranks]
            hit = self._wts[key] = (taus, relax_weights(taus), equal_weights(taus, m, f))
        return hit

    def lines(self, c: ReplicaClass, k: Knobs, m: int, k0: int) -> Lines:
        """The relax- and equal-weighted lines of class ``c`` over every split (cached)."""
        key = (c.ranks, c.count, c.layout, k.cp, k.micro_batch, k.sequence_parallel,
               k.recompute, k.vpp, self.fill(c, k), m, k0, k.axes)
        hit = self._line.get(key)
        if hit is None:
            taus, w, eq = self.weights(c, k, m)
            ext, f, n = self.extras(c, k), self.fill(c, k), self.n_layers
            hit = self._line[key] = (line_over_splits(w, taus, ext, n, k.vpp, k0, f),
                                     line_over_splits(eq, taus, ext, n, k.vpp, k0, f))
        return hit

    def class_lb(self, c: ReplicaClass, k: Knobs) -> float:
        """A lower bound on a class's slowest-rank time over all splits: each rank r needs
        n_r t_r + e_r with sum n_r = L and n_r >= vpp, so the slowest takes at least
        max((L + sum e_r/t_r) / sum(1/t_r), vpp t_r + e_r)."""
        key = (c.ranks, c.count, c.layout, k.cp, k.micro_batch, k.sequence_parallel,
               k.recompute, k.vpp, k.axes)
        hit = self._inv.get(key)
        if hit is None:
            n, v = self.n_layers, k.vpp
            ext = self.extras(c, k)
            ts = [self.stage(slot.group, slot.tp, k).layer_time_s for slot in c.ranks]
            relax = (n + sum(e / t for e, t in zip(ext, ts, strict=True))) / sum(
                1.0 / t for t in ts
            )
            least = max(v * t + e for e, t in zip(ext, ts, strict=True))
            hit = self._inv[key] = max(relax, least)
        return hit
