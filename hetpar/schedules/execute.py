"""Timing a schedule: earliest start of every action given durations, transfers and rank order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.schedules.base import Action, Schedule

Duration = Callable[[int, Action], float]
P2P = float | Callable[[int, int], float]


@dataclass(frozen=True, kw_only=True)
class ChunkTimes:
    """Seconds per microbatch for each model chunk (the fast form of durations).

    ``backward`` is the input-gradient part; ``weight`` the weight-gradient part (empty = 0).
    For schedules that do not split the backward, a B action takes ``backward + weight``.
    """

    forward: Sequence[float]
    backward: Sequence[float]
    weight: Sequence[float] = ()


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """When every action ran: per rank ``(action, start, end)`` in rank order (seconds)."""

    ranks: tuple[tuple[tuple[Action, float, float], ...], ...]
    makespan: float
    busy: tuple[float, ...]
    """Per rank, the seconds spent computing."""

    @property
    def idle(self) -> tuple[float, ...]:
        """Per rank, the seconds not computing before the makespan."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble(self) -> float:
        """Makespan minus the busiest rank's compute: the pipeline's unavoidable idle time."""
        return self.makespan - max(self.busy)


def _table(schedule: Schedule, times: ChunkTimes) -> list[Sequence[float]]:
    n = schedule.num_chunks
    weight = list(times.weight) if times.weight else [0.0] * n
    for key, seq in (("forward", times.forward), ("backward", times.backward), ("weight", weight)):
        if len(seq) != n:
            raise ConfigError(f"chunk times: {key} has {len(seq)} entries, schedule has {n} chunks")
        if min(seq) < 0:
            raise ConfigError(f"chunk times: {key} has a negative duration {min(seq)}")
    if schedule.splits_backward:
        return [times.forward, times.backward, weight]
    return [times.forward, [b + w for b, w in zip(times.backward, weight, strict=True)], weight]


def _durations(schedule: Schedule, duration: Duration | ChunkTimes) -> list[list[float]]:
    """Per rank, the duration of each of its actions in order."""
    if isinstance(duration, ChunkTimes):
        table = _table(schedule, duration)
        return [[table[k][c] for k, c, _ in acts] for acts in schedule.compiled]
    return [[float(duration(r, a)) for a in acts] for r, acts in enumerate(schedule.ranks)]


def _transfers(schedule: Schedule, p2p: P2P) -> tuple[list[float], list[float]]:
    """Forward transfer c -> c+1 and backward transfer c+1 -> c, zero within one rank (pp = 1,
    or the turn of a V-shaped placement on its last rank)."""
    n = schedule.num_chunks
    local = [c + 1 < n and schedule.rank_of(c) == schedule.rank_of(c + 1) for c in range(n)]
    if callable(p2p):
        fwd = [0.0 if local[c] else float(p2p(c, c + 1)) for c in range(n)]
        return fwd, [0.0 if local[c] else float(p2p(c + 1, c)) for c in range(n)]
    return [0.0 if x else float(p2p) for x in local], [0.0 if x else float(p2p) for x in local]


def execute(schedule: Schedule, duration: Duration | ChunkTimes, p2p: P2P = 0.0) -> Timeline:
    """Time ``schedule``: every action starts when its rank is free and its inputs have arrived.

    Dependencies: F(c,m) after F(c-1,m) + transfer; B(c,m) after F(c,m) and, unless c is
    the last chunk, after B(c+1,m) + transfer; W(c,m) after B(c,m). ``duration`` is either
    ``ChunkTimes`` (fast) or ``duration(rank, action) -> seconds``; ``p2p`` is seconds per
    transfer or ``p2p(chunk_from, chunk_to)``. A schedule that deadlocks is a bug in the
    schedule: AssertionError names the stuck ranks and actions.
    """
    dur = _durations(schedule, duration)
    pf, pb = _transfers(schedule, p2p)
    starts = _longest_paths(schedule, dur, pf, pb)
    ranks = tuple(
        tuple(zip(acts, st, [s + d for s, d in zip(st, ds, strict=True)], strict=True))
        for acts, st, ds in zip(schedule.ranks, starts, dur, strict=True)
    )
    makespan = max((acts[-1][2] for acts in ranks if acts), default=0.0)
    return Timeline(ranks=ranks, makespan=makespan, busy=tuple(sum(ds) for ds in dur))


def _longest_paths(
    schedule: Schedule, dur: list[list[float]], pf: list[float], pb: list[float]
) -> list[list[float]]:
    """Start times of every action (per rank, in order), resolving dependencies by worklist.

    A rank runs until an input is missing, registers as waiting on it, and is resumed when
    that action completes, so each action is visited a constant number of times.
    """
    m, last = schedule.num_microbatches, schedule.num_chunks - 1
    n = schedule.num_chunks * m
    end = [-1.0] * (3 * n)  # end time per (kind, chunk, microbatch); -1 = not done yet
    ptr, free = [0] * schedule.pp, [0.0] * schedule.pp
    starts: list[list[float]] = [[] for _ in range(schedule.pp)]
    waiting: dict[int, list[int]] = {}
    stack = list(range(schedule.pp - 1, -1, -1))
    while stack:
        r = stack.pop()
        acts, d, st = schedule.compiled[r], dur[r], starts[r]
        i, t, count = ptr[r], free[r], len(acts)
        while i < count:
            k, c, mb = acts[i]
            idx = c * m + mb
            if k == 1:  # B(c) needs F(c) and, unless c is last, B(c+1) and its transfer
                dep = idx if end[idx] < 0 or c == last else n + idx + m
                ready = end[idx] if c == last else max(end[idx], end[n + idx + m] + pb[c])
            elif k == 0:  # F(c) needs F(c-1) and its transfer
                dep = idx - m if c else -1
                ready = end[dep] + pf[c - 1] if c else 0.0
            else:  # W(c) needs B(c)
                dep = n + idx
                ready = end[dep]
            if dep >= 0 and end[dep] < 0:
                waiting.setdefault(dep, []).append(r)
                break
            s = t if t > ready else ready
            st.append(s)
            t = s + d[i]
            key = k * n + idx
            end[key] = t
            if key in waiting:
                stack.extend(waiting.pop(key))
            i += 1
        ptr[r], free[r] = i, t
    stuck = [
        f"rank {r} at {schedule.ranks[r][ptr[r]]}"
        for r in range(schedule.pp)
        if ptr[r] < len(schedule.ranks[r])
    ]
    assert not stuck, f"schedule {schedule.name} deadlocks: " + "; ".join(stuck)
    return starts


def in_flight(schedule: Schedule, until: Literal["B", "W"] = "B") -> tuple[int, ...]:
    """Per rank, the most (chunk, microbatch) activations held at once.

    An activation is held from its F until its B (``until="B"``, the stash the input
    gradient needs) or until its last backward action (``until="W"``: W still needs the
    layer inputs, Qi et al. ICLR'24 Table 1). Counting is in rank order, so it is timing-free.
    """
    return tuple(int(p) for p in in_flight_weighted(schedule, None, until))


def in_flight_weighted(
    schedule: Schedule, weights: Sequence[float] | None, until: Literal["B", "W"] = "B"
) -> tuple[float, ...]:
    """``in_flight`` with each activation weighed by its model chunk (``weights[chunk]``,
    e.g. its layer count; None: 1 each): the peak of the weighted sum, which the plain count
    times the mean weight misses when a rank's chunks differ (padded or uneven layer splits)."""
    last = "W" if until == "W" and schedule.splits_backward else "B"
    peaks = []
    for acts in schedule.ranks:
        held = peak = 0.0
        for a in acts:
            w = 1.0 if weights is None else weights[a.chunk]
            if a.kind == "F":
                held += w
                peak = max(peak, held)
            elif a.kind == last:
                held -= w
        peaks.append(peak)
    return tuple(peaks)
