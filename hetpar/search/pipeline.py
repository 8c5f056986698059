"""Pipeline-shape helpers shared by the planner and the cost models (in-flight, weights)."""

from __future__ import annotations

from functools import lru_cache

from hetpar import schedules


@lru_cache(maxsize=4096)
def inflight(schedule: str, pp: int, vpp: int, microbatches: int) -> tuple[float, ...]:
    """Per pipeline rank, the peak number of micro-batches whose activations it holds,
    in whole-rank units (a chunk is 1/vpp of the rank's layers), read off the schedule data.

    Except for GPipe the peak stops growing after a few rounds (1F1B holds pp - rank,
    Narayanan et al. 2021), so long schedules are counted on a shorter one.
    """
    m = microbatches
    if schedule != "gpipe":
        step = pp if schedule == "interleaved" else 1
        cap = (2 * pp * vpp + pp + step - 1) // step * step
        m = min(m, cap)
    sched = schedules.build(schedule, pp, m, vpp)
    peaks = schedules.in_flight(sched, until="W" if sched.splits_backward else "B")
    return tuple(p / vpp for p in peaks)


def pipeline_weights(schedule: str, pp: int, vpp: int, microbatches: int) -> tuple[float, float]:
    """``(a, b)`` with replica time ``a * max_rank + b * sum_ranks`` (per micro-batch times).

    1F1B/GPipe: the bottleneck rank runs all m micro-batches and the first forward and
    last backward cross every other rank: (m-1) max + sum (Narayanan et al. 2021, eq. 1
    generalised to uneven stages). Interleaving divides the fill by vpp; ZB-H1 leaves about
    a third of it (Qi et al. ICLR'24, Table 2).
    """
    m = microbatches
    if pp == 1:
        return float(m), 0.0
    if schedule == "interleaved" and vpp > 1:
        return m - 1.0 / vpp, 1.0 / vpp
    if schedule == "zb-h1":
        return m - 1.0 / 3.0, 1.0 / 3.0
    return m - 1.0, 1.0
