"""DeepSpeed PipelineEngine's lock-step TrainSchedule with blocking pairwise exchanges."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

Action = tuple[bool, int] | None
"""(is_forward, micro-batch) a stage runs in one step, or None (idle)."""


def train_schedule(pp: int, m: int) -> list[list[Action]]:
    """Per step, per stage: DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py).

    2 (m + pp - 1) steps; in a step a stage of the same parity as the step runs a forward,
    the other parity a backward, so neighbours always exchange in the same step: a stage in
    a forward step receives the activation from (and sends its last gradient to) the stage
    before it, which is in a backward step (it sends its last activation, receives the
    gradient). Micro-batch ids follow ``_step_to_micro_batch``; ids outside [0, m) are idle.
    """
    steps: list[list[Action]] = []
    for t in range(2 * (m + pp - 1)):
        row: list[Action] = []
        for s in range(pp):
            forward = t % 2 == s % 2
            if forward:
                mb = (t if t % 2 == 0 else t - 1) // 2 - s // 2
            elif t % 2 == 0:
                mb = t // 2 - pp + (s + 1) // 2
            else:
                mb = (t - 1) // 2 - pp + 1 + s // 2
            row.append((forward, mb) if 0 <= mb < m else None)
        steps.append(row)
    return steps


Times = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...]]
"""(fwd, bwd, act, grad) per stage, the inputs of ``run`` and ``makespan``."""
Step = tuple[bool, int, float, float]
"""(is_forward, micro-batch, start, end) of one stage's action; start includes the exchange."""


def makespan(
    fwd: Sequence[float], bwd: Sequence[float], act: Sequence[float], grad: Sequence[float],
    m: int,
) -> float:
    """Seconds until the last stage finishes its last action (see ``run``).

    The same additions as ``run`` in the same order (so the same float), over the steps
    compiled once per (stages, micro-batches) and without the per-action records; the
    result is memoized on the inputs' values (a new cluster state often leaves a
    replica's stage times as they were). tests/test_sim_lockstep_fast.py checks it equals
    ``run``'s last end on random inputs.
    """
    key = (tuple(fwd), tuple(bwd), tuple(act), tuple(grad), m)
    hit = _SPANS.get(key)
    if hit is None:
        if len(_SPANS) > MAX_SPANS:
            _SPANS.clear()
        hit = _SPANS[key] = _makespan(*key)
    return hit


MAX_SPANS = 20_000
"""Makespans kept (a key is four short tuples of floats; a replay of 71 states on
hetero-1024 times about a thousand pipelines per state)."""
_SPANS: dict[tuple[object, ...], float] = {}

Compiled = tuple[tuple[tuple[int, int, int, int], ...], ...]
"""Per step, per stage: (partner stage or -1, index of the activation it moves or -1, of
the gradient or -1, work: 0 idle, 1 forward, 2 backward)."""


@lru_cache(maxsize=1024)
def _compiled(pp: int, m: int) -> Compiled:
    """``train_schedule`` with ``_exchange``'s choices resolved to indices (value-free).

    In the steady state every stage runs every step, so a step's row depends only on its
    parity: a long schedule is the one for ``_SHORT(pp)`` micro-batches with its middle
    two-step period repeated (tests/test_sim_lockstep_fast.py checks it against the direct
    compilation)."""
    short = _short(pp)
    if m <= short:
        return _direct(pp, m)
    rows = _direct(pp, short)
    h = len(rows) // 2 // 2 * 2  # an even split keeps each row's parity
    return rows[:h] + rows[h - 2:h] * (m - short) + rows[h:]


def _short(pp: int) -> int:
    """Micro-batches whose schedule has full steps around its middle (ramp-up and down
    each take under 2 pp steps)."""
    return 2 * pp + 4


def _direct(pp: int, m: int) -> Compiled:
    """``_compiled`` step by step from ``train_schedule``."""
    steps = []
    last: list[Action] = [None] * pp
    for t, row in enumerate(train_schedule(pp, m)):
        out = []
        for s in range(pp):
            forward = t % 2 == s % 2
            if forward and s > 0:
                lo, hi = s - 1, s
            elif not forward and s + 1 < pp:
                lo, hi = s, s + 1
            else:
                lo = hi = -1
            partner = ai = gi = -1
            if lo >= 0:
                partner = lo if s == hi else hi
                prev_lo, prev_hi = last[lo], last[hi]
                ai = lo if prev_lo is not None and prev_lo[0] and row[hi] is not None else -1
                gi = lo if prev_hi is not None and not prev_hi[0] else -1
            a = row[s]
            out.append((partner, ai, gi, 0 if a is None else 1 if a[0] else 2))
        steps.append(tuple(out))
        last = row
    return tuple(steps)


def _makespan(fwd: tuple[float, ...], bwd: tuple[float, ...], act: tuple[float, ...],
              grad: tuple[float, ...], m: int) -> float:
    """``run``'s arithmetic over ``_compiled`` steps, keeping only each stage's last end."""
    pp = len(fwd)
    end = [0.0] * pp
    final: list[float | None] = [None] * pp
    for step in _compiled(pp, m):
        prev = end[:]
        s = 0
        for partner, ai, gi, w in step:
            start = prev[s]
            if partner >= 0 and prev[partner] > start:  # max(prev[s], prev[partner])
                start = prev[partner]
            xfer = 0.0
            if ai >= 0:
                xfer += act[ai]
            if gi >= 0:
                xfer += grad[gi]
            if w:
                e = end[s] = start + xfer + (fwd[s] if w == 1 else bwd[s])
                final[s] = e
            else:
                e = end[s] = start + xfer + 0.0
                if xfer > 0:
                    final[s] = e
            s += 1
    return max((e for e in final if e is not None), default=0.0)


def run(
    fwd: Sequence[float], bwd: Sequence[float], act: Sequence[float], grad: Sequence[float],
    m: int,
) -> list[list[Step]]:
    """Per stage, its actions in order with their start and end times.

    ``fwd``/``bwd``: compute per micro-batch of each stage (no transfers); ``act[i]``: moving
    stage i's activation to i + 1; ``grad[i]``: moving the gradient from stage i + 1 back to i.
    A stage starts a step when it and the neighbour it exchanges with in that step have both
    finished the previous one (the two-rank ``dist.broadcast`` blocks both); the exchange
    (activation and gradient of the previous step's micro-batches) precedes the compute.
    """
    pp = len(fwd)
    end = [0.0] * pp
    last: list[Action] = [None] * pp
    out: list[list[Step]] = [[] for _ in range(pp)]
    for t, row in enumerate(train_schedule(pp, m)):
        prev = end[:]
        for s in range(pp):
            partner, xfer = _exchange(s, t % 2 == s % 2, row, last, act, grad)
            start = max(prev[s], prev[partner]) if partner is not None else prev[s]
            a = row[s]
            work = 0.0 if a is None else (fwd[s] if a[0] else bwd[s])
            end[s] = start + xfer + work
            if a is not None:
                out[s].append((a[0], a[1], start, end[s]))
            elif xfer > 0:
                # a stage idle in this step still sends what its last step produced
                out[s].append((not (t % 2 == s % 2), -1, start, end[s]))
        last = row
    return out


def _exchange(
    s: int, forward: bool, row: list[Action], last: list[Action], act: Sequence[float],
    grad: Sequence[float],
) -> tuple[int | None, float]:
    """The neighbour stage s exchanges with in this step and the seconds both spend on it."""
    if forward and s > 0:
        lo, hi = s - 1, s
    elif not forward and s + 1 < len(row):
        lo, hi = s, s + 1
    else:
        return None, 0.0
    t = 0.0
    # the lower stage sends the activation of its previous (forward) step's micro-batch ...
    prev_lo, prev_hi = last[lo], last[hi]
    if prev_lo is not None and prev_lo[0] and row[hi] is not None:
        t += act[lo]
    # ... and the upper stage the gradient of its previous (backward) step's micro-batch
    if prev_hi is not None and not prev_hi[0]:
        t += grad[lo]
    return (lo if s == hi else hi), t
