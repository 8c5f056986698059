"""Failure-detector deadlines that stretch with the observed step time: load is no failure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

STEPS_PER_DEADLINE = 10.0
"""A rank is suspected only after missing this many median steps' worth of progress. An
adaptive threshold, as in accrual failure detectors (Hayashibara et al., "The phi accrual
failure detector", SRDS 2004: the suspicion level follows the observed inter-arrival times
instead of a fixed timeout); here the observed quantity is the step time, which a loaded
machine stretches for every rank alike, heartbeat thread included."""


def adaptive(floor_s: float, step_times_s: Sequence[float],
             k: float = STEPS_PER_DEADLINE) -> float:
    """``max(floor_s, k x median step time)``: the fixed floor until steps are observed."""
    if not step_times_s:
        return floor_s
    return max(floor_s, k * statistics.median(step_times_s))
