"""DeepSpeed PipelineEngine's lock-step TrainSchedule with blocking pairwise exchanges."""

from __future__ import annotations

from collections.abc import Sequence

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
    """Seconds until the last stage finishes its last action (see ``run``)."""
    return max((acts[-1][3] for acts in run(fwd, bwd, act, grad, m) if acts), default=0.0)


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
