"""Pipeline-shape helpers shared by the planner and the cost models (in-flight, weights)."""

from __future__ import annotations

from functools import lru_cache

from hetpar import schedules


@lru_cache(maxsize=4096)
def inflight(schedule: str, pp: int, vpp: int, microbatches: int) -> tuple[float, ...]:
    """Per pipeline rank, the peak number of micro-batches whose activations it holds,
    in whole-rank units (a chunk is 1/vpp of the rank's layers), read off the schedule data.

    When the schedule declares its peak bounded (1F1B holds pp - rank, Narayanan et al. 2021)
    long schedules are counted on a shorter one, rounded to its micro-batch unit.
    """
    m = microbatches
    tr = schedules.traits(schedule)
    if tr.in_flight_bounded:
        step = tr.microbatch_unit(pp)
        cap = (2 * pp * vpp + pp + step - 1) // step * step
        m = min(m, cap)
    sched = schedules.build(schedule, pp, m, vpp)
    peaks = schedules.in_flight(sched, until="W" if sched.splits_backward else "B")
    return tuple(p / vpp for p in peaks)


@lru_cache(maxsize=65536)
def pipeline_weights(schedule: str, pp: int, vpp: int, microbatches: int) -> tuple[float, float]:
    """``(a, b)`` with replica time ``a * max_rank + b * sum_ranks`` (per micro-batch times).

    The schedule declares its fill weight (``Traits.fill``): 1F1B/GPipe pay the whole sum
    once, (m-1) max + sum (Narayanan et al. 2021, eq. 1 generalised to uneven stages);
    interleaving divides it by vpp; ZB-H1 leaves about a third (Qi et al. ICLR'24, Table 2).
    A schedule that declares none is bounded by m max alone, valid for any schedule.
    """
    return schedules.traits(schedule).weights(pp, vpp, microbatches)
