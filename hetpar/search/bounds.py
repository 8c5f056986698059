"""Upper bounds on a candidate's throughput that keep the pipeline fill (bubble) term."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class ClassBound(NamedTuple):
    """What the bound knows of one replica class (times per micro-batch, seconds).

    A replica running k micro-batches takes ``(k - a_offset) * max + b * sum`` (the
    pipeline weights, Narayanan et al. 2021 eq. 1 generalised to uneven ranks), where
    ``max`` >= ``max_lb`` and ``sum`` >= ``sum_lb`` for every layer split.
    """

    replicas: int
    max_lb: float
    sum_lb: float
    a_offset: float
    b: float


def least_makespan(classes: Sequence[ClassBound], microbatches: int, least_share: int) -> float:
    """A lower bound on the iteration's compute makespan over all splits and all shares.

    Every replica takes at least ``least_share`` micro-batches (the share solver and
    polishing never go below one share unit) and the shares sum to ``microbatches``.
    With ``k >= least_share >= a_offset`` and ``b >= 0`` a replica's time is at least
    ``h(k) = (k - a_offset) max_lb + b sum_lb``, increasing in k; any makespan T then
    needs ``sum_c count_c (a_offset_c + (T - b_c sum_lb_c) / max_lb_c) >= microbatches``
    and ``T >= h_c(least_share)`` for every class. The least such T is returned.

    Classes whose weights break those assumptions (a cost model with other pipeline
    weights) fall back to ``h(k) = k max_lb``, the bound without the fill term (valid as
    long as the replica time is at least k times its slowest rank, as before).
    """
    inv = fill = floor = 0.0
    for c in classes:
        a_off, b = c.a_offset, c.b
        if not (0.0 <= a_off <= least_share and b >= 0.0):
            a_off = b = 0.0
        inv += c.replicas / c.max_lb
        fill += c.replicas * (b * c.sum_lb / c.max_lb - a_off)
        floor = max(floor, (least_share - a_off) * c.max_lb + b * c.sum_lb)
    return max((microbatches + fill) / inv, floor)
