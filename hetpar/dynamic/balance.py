"""Batch shares for the replay planner's split plans, balanced by the throughput model.

A replica's iteration is roughly ``c + m * tau`` for ``m`` micro-batches (1F1B: the pipeline
fill and drain are the constant, each further micro-batch costs its slowest stage; Narayanan
et al. 2021 Sec. 2.2), so the batch is shared to equalise those lines across replicas, not
in proportion to peak FLOP/s: peak ignores the bubble, TP efficiency and the memory-bound
work that differ between GPU generations. ``tau`` and ``c`` come from two probe runs of the
replica's node group alone on the same throughput model that scores the plans (simulator
or analytic).
"""

from __future__ import annotations

from collections.abc import Callable

from hetpar.search.split import batch_shares

Line = tuple[float, float]
"""(c, tau): seconds of a replica's iteration for m micro-batches is c + m * tau."""


def line_from_probes(m1: int, t1: float, m2: int, t2: float) -> Line | None:
    """The line through two (micro-batches, seconds) probes; None if they are unusable."""
    if t1 <= 0 or t2 <= 0 or m2 <= m1:
        return None
    tau = max((t2 - t1) / (m2 - m1), 1e-12)
    return max(t1 - m1 * tau, 0.0), tau


def shares(lines: list[Line], units: int) -> list[int] | None:
    """Micro-batches per replica minimising the slowest replica's ``c + m tau`` (exact greedy
    of hetpar.search.split.batch_shares); None when there are fewer units than replicas."""
    fns: list[Callable[[int], float]] = [_line_fn(c, tau) for c, tau in lines]
    got = batch_shares(fns, units)
    return None if got is None else got[0]


def _line_fn(c: float, tau: float) -> Callable[[int], float]:
    return lambda m: c + m * tau
