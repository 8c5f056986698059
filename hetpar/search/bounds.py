"""Upper bounds on a candidate's throughput that keep the pipeline fill (bubble) term."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class ClassBound(NamedTuple):
    """What the bound knows of one replica class (times per micro-batch, seconds).

    A replica running k micro-batches takes ``(k - a_offset) * max + b * sum`` (the
    pipeline weights, Narayanan et al. 2021 eq. 1 generalised to uneven ranks), where
    ``max`` >= ``max_lb`` and ``sum`` >= ``sum_lb`` for every layer split; ``tail`` is
    what the cost model adds after the pipeline at least (gradient sync, optimizer step).
    """

    replicas: int
    max_lb: float
    sum_lb: float
    a_offset: float
    b: float
    tail: float = 0.0


def least_makespan(classes: Sequence[ClassBound], microbatches: int, least_share: int) -> float:
    """A lower bound on the iteration's makespan over all splits and all shares.

    Every replica takes at least ``least_share`` micro-batches (the share solver and
    polishing never go below one share unit) and the shares sum to ``microbatches``.
    With ``k >= least_share >= a_offset`` and ``b >= 0`` a replica's pipeline takes at
    least ``h(k) = (k - a_offset) max_lb + b sum_lb``, increasing in k; any makespan T then
    needs ``sum_c count_c (a_offset_c + (T - b_c sum_lb_c) / max_lb_c) >= microbatches``
    and ``T >= h_c(least_share)`` for every class. The least such T is returned.

    The fill term ``b sum_lb`` is the schedule formula of ``pipeline_weights``, which
    over-counts the fill of uneven 1F1B pipelines (warm-up forwards of a slow rank hide
    the fill of faster ones); the cost model's slack covers that, but not when a tail is
    added on top. So the tail (``h(k) = k max_lb + tail``: a pipeline takes at least k
    times its slowest rank, then the tail) is only combined with the fill-free form, and
    the larger of the two bounds is returned. Classes whose weights break the assumptions
    above (a cost model with other pipeline weights) use the fill-free form only.
    """
    with_fill = _solve(classes, microbatches, least_share, fill=True)
    if not any(c.tail for c in classes):
        return with_fill
    return max(with_fill, _solve(classes, microbatches, least_share, fill=False))


def _solve(classes: Sequence[ClassBound], microbatches: int, least_share: int, *,
           fill: bool) -> float:
    """The least T of ``least_makespan`` with the fill term (no tail) or the tail (no fill)."""
    inv = extra = floor = 0.0
    for c in classes:
        a_off, b, tail = c.a_offset, c.b, 0.0
        if not fill or not (0.0 <= a_off <= least_share and b >= 0.0):
            a_off = b = 0.0
        if not fill:
            tail = c.tail
        inv += c.replicas / c.max_lb
        extra += c.replicas * ((b * c.sum_lb + tail) / c.max_lb - a_off)
        floor = max(floor, (least_share - a_off) * c.max_lb + b * c.sum_lb + tail)
    return max((microbatches + extra) / inv, floor)
