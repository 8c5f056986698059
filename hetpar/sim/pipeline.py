"""Closed-form pipeline makespan and in-flight micro-batches for the registered schedules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetpar.errors import ConfigError, Infeasible
from hetpar.schedules import build, in_flight, names

ONE_CHUNK = ("gpipe", "1f1b", "zb-h1")


@dataclass(frozen=True, slots=True)
class RankTimes:
    """Seconds per micro-batch on one pipeline rank, summed over its chunks.

    ``fwd`` and ``bwd`` include the blocking p2p sends of that rank; ``wgt`` is the
    weight-gradient part of the backward (separate only for zero-bubble schedules).
    """

    fwd: float
    bwd: float
    wgt: float

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.wgt


def check_schedule(schedule: str, pp: int, vpp: int, m: int) -> None:
    """ConfigError for an unknown schedule, Infeasible for a combination it cannot run."""
    if schedule not in names():
        raise ConfigError(f"plan: schedule {schedule!r} unknown; allowed: {', '.join(names())}")
    if schedule in ONE_CHUNK and vpp != 1:
        raise Infeasible("schedule", f"{schedule} has one chunk per rank, got vpp={vpp}")
    if schedule == "interleaved" and pp > 1 and m % pp:
        # Megatron-LM's interleaved schedule runs micro-batches in groups of pp.
        raise Infeasible("schedule", f"interleaved needs micro-batches ({m}) % pp ({pp}) == 0")


def makespan(
    schedule: str, ranks: Sequence[RankTimes], m: int, vpp: int, *, exact: bool = False
) -> float:
    """Pipeline time of ``m`` micro-batches; closed form unless ``exact``.

    1F1B: the slowest path through a bottleneck rank k -- the first micro-batch's forwards up
    to k, k busy for m x (F + B), its wait for the first gradient beyond what its warm-up
    forwards cover, and the last gradient's way back to rank 0; for uniform ranks this is
    (m + p - 1)(F + B) (Narayanan et al. 2021 Sec. 2.2). GPipe: the forward and backward
    waves. Interleaved with v chunks divides the fill/drain part by v (ibid. Sec. 2.2.2).
    ZB-H1 shortens the fill/drain to F + B - W per rank (Qi et al. 2024, Sec. 2.1). Unknown
    schedules, and ``exact``, are timed by the event-driven executor of hetpar.schedules.
    """
    if len(ranks) == 1:
        return m * ranks[0].total
    if exact or schedule not in ("gpipe", "1f1b", "interleaved", "zb-h1"):
        return _executed(schedule, ranks, m, vpp)
    totals = [r.total for r in ranks]
    slow = max(totals)
    if schedule == "gpipe":
        f = [r.fwd for r in ranks]
        b = [r.bwd + r.wgt for r in ranks]
        return sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)
    if schedule == "1f1b":
        return _one_f_one_b(ranks, m)
    if schedule == "interleaved":
        return m * slow + (sum(totals) - slow) / vpp
    fill = [max(r.fwd + r.bwd - r.wgt, 0.0) for r in ranks]
    i = totals.index(slow)
    return m * slow + sum(fill) - fill[i]


def _one_f_one_b(ranks: Sequence[RankTimes], m: int) -> float:
    p = len(ranks)
    f = [r.fwd for r in ranks]
    b = [r.bwd + r.wgt for r in ranks]
    best = 0.0
    down = 0.0  # sum over ranks after k of (F + B): the first gradient's round trip
    for k in range(p - 1, -1, -1):
        wait = max(0.0, down - (p - k - 1) * f[k])
        best = max(best, sum(f[:k]) + m * (f[k] + b[k]) + wait + sum(b[:k]))
        down += f[k] + b[k]
    return best


def _executed(schedule: str, ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    from hetpar.schedules import ChunkTimes, execute

    sched = build(schedule, len(ranks), m, vpp)
    n = len(ranks) * vpp
    per = [ranks[c % len(ranks)] for c in range(n)]
    times = ChunkTimes(
        forward=[r.fwd / vpp for r in per], backward=[r.bwd / vpp for r in per],
        weight=[r.wgt / vpp for r in per],
    )
    return execute(sched, times).makespan


def in_flight_chunks(schedule: str, pp: int, m: int, vpp: int, rank: int) -> int:
    """Most (chunk, micro-batch) activations rank ``rank`` stashes at once.

    1F1B: pp - rank (Narayanan et al. 2021); ZB-H1: pp on every rank, since the delayed W
    still needs the layer inputs (Qi et al. ICLR'24, Table 1: 1F1B's peak, on every rank);
    GPipe: all m; interleaved (Megatron-LM): 2(pp - rank - 1) + (v - 1) pp warm-up chunks plus
    the one running. Other schedules are counted from their action lists, held until W.
    """
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, pp - rank)
    if schedule == "zb-h1":
        return min(m, pp)
    if schedule == "interleaved":
        return min(m * vpp, 2 * (pp - rank - 1) + (vpp - 1) * pp + 1)
    return in_flight(build(schedule, pp, m, vpp), until="W")[rank]
