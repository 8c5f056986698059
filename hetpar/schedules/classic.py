"""GPipe, 1F1B (PipeDream-flush) and Megatron's interleaved 1F1B schedules."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.errors import Infeasible
from hetpar.schedules.base import Action, RankTimes, Traits
from hetpar.schedules.registry import register, require_vpp1


def _gpipe_makespan(ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    """The forward wave then the backward wave, each paced by its slowest rank."""
    f = [r.fwd for r in ranks]
    b = [r.bwd + r.wgt for r in ranks]
    return sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)


def _one_f_one_b_makespan(ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    """1F1B: the slowest path through a bottleneck rank k -- the first micro-batch's forwards up
    to k, k busy for m x (F + B), its wait for the first gradient beyond what its warm-up
    forwards cover, and the last gradient's way back to rank 0; for uniform ranks this is
    (m + p - 1)(F + B) (Narayanan et al. 2021 Sec. 2.2)."""
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


def _interleaved_makespan(ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    """Interleaving with v chunks divides the fill/drain part by v (ibid. Sec. 2.2.2)."""
    totals = [r.total for r in ranks]
    slow = max(totals)
    return m * slow + (sum(totals) - slow) / vpp


@register("gpipe", Traits(
    fill=lambda vpp: 1.0, makespan=_gpipe_makespan,
    in_flight=lambda pp, m, vpp, rank: m,  # every forward before any backward: all m
))
def gpipe(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """GPipe (Huang et al., NeurIPS'19): every forward, then every backward (holds m stashes)."""
    require_vpp1("gpipe", vpp)
    return [
        [Action(kind="F", chunk=r, microbatch=i) for i in range(m)]
        + [Action(kind="B", chunk=r, microbatch=i) for i in range(m)]
        for r in range(pp)
    ]


@register("1f1b", Traits(
    fill=lambda vpp: 1.0, makespan=_one_f_one_b_makespan,
    in_flight=lambda pp, m, vpp, rank: min(m, pp - rank), in_flight_bounded=True,
    # DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py) interleaves one forward
    # and one backward: this schedule in lock step
    lockstep=True,
))
def one_f_one_b(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """PipeDream-flush / Megatron non-interleaved 1F1B (Narayanan et al., SC'21 sec 2.2.1).

    Rank r runs pp-r-1 warm-up forwards, then alternates one forward and one backward, then
    drains the remaining backwards; so it holds at most pp-r activations at once.
    """
    require_vpp1("1f1b", vpp)
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action(kind="F", chunk=r, microbatch=i) for i in range(warm)]
        for i in range(m - warm):
            acts.append(Action(kind="F", chunk=r, microbatch=warm + i))
            acts.append(Action(kind="B", chunk=r, microbatch=i))
        acts += [Action(kind="B", chunk=r, microbatch=i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def _virtual(k: int, pp: int, vpp: int, backward: bool) -> tuple[int, int]:
    """The (local chunk, microbatch) of a rank's k-th forward (or backward) in interleaved order.

    Microbatches go in groups of pp: the group runs through local chunk 0, then chunk 1, ...
    (SC'21 sec 2.2.2, Fig. 4); backwards visit the chunks in reverse.
    """
    local = (k // pp) % vpp
    if backward:
        local = vpp - 1 - local
    return local, (k // (pp * vpp)) * pp + k % pp


@register("interleaved", Traits(
    chunks="looped", min_pp=2, microbatches_per_pp=True,
    fill=lambda vpp: 1.0 / vpp, makespan=_interleaved_makespan,
    # Megatron-LM's warm-up: 2(pp - rank - 1) + (v - 1) pp chunks plus the one running.
    in_flight=lambda pp, m, vpp, rank: min(m * vpp, 2 * (pp - rank - 1) + (vpp - 1) * pp + 1),
    in_flight_bounded=True,
))
def interleaved(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """Megatron interleaved 1F1B (Narayanan et al., SC'21 sec 2.2.2): vpp model chunks per rank.

    Local chunk j of rank r is model chunk j*pp + r. Like Megatron-LM, it needs vpp >= 2,
    pp >= 2 and num_microbatches a multiple of pp. Warm-up length per rank follows Megatron's
    choice 2*(pp-r-1) + (vpp-1)*pp forwards, after which forwards and backwards alternate.
    """
    if vpp < 2:
        raise Infeasible("schedule", f"interleaved needs vpp >= 2 chunks per rank, got vpp={vpp}")
    if pp < 2:
        raise Infeasible("schedule", f"interleaved needs pp >= 2, got pp={pp}")
    if m % pp:
        raise Infeasible(
            "schedule", f"interleaved needs num_microbatches ({m}) to be a multiple of pp ({pp})"
        )
    total = m * vpp
    out = []
    for r in range(pp):
        # With m == pp there is no steady phase: Megatron runs every forward first.
        warm = total if m == pp else min(total, 2 * (pp - r - 1) + (vpp - 1) * pp)

        def act(kind: str, k: int, r: int = r) -> Action:
            local, mb = _virtual(k, pp, vpp, backward=kind == "B")
            return Action(kind="F" if kind == "F" else "B", chunk=local * pp + r, microbatch=mb)

        acts = [act("F", k) for k in range(warm)]
        for i in range(total - warm):
            acts.append(act("F", warm + i))
            acts.append(act("B", i))
        acts += [act("B", k) for k in range(total - warm, total)]
        out.append(acts)
    return out
