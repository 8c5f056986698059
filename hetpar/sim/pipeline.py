"""Pipeline makespan and in-flight micro-batches, from what each schedule declares."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from hetpar.schedules import RankTimes, build, in_flight, in_flight_weighted, placement, traits
from hetpar.schedules import check as check_traits

__all__ = ["RankTimes", "check_schedule", "in_flight_chunks", "in_flight_layers", "makespan"]


def check_schedule(schedule: str, pp: int, vpp: int, m: int) -> None:
    """ConfigError for an unknown schedule, Infeasible for a combination it cannot run."""
    check_traits(schedule, pp, vpp, m)


def makespan(
    schedule: str, ranks: Sequence[RankTimes], m: int, vpp: int, *, exact: bool = False
) -> float:
    """Pipeline time of ``m`` micro-batches: the schedule's closed form unless ``exact``.

    The closed forms live with the schedules (``hetpar.schedules.Traits.makespan``, each
    citing its source); a schedule without one, and ``exact``, is timed by the event-driven
    executor of hetpar.schedules.
    """
    if len(ranks) == 1:
        return m * ranks[0].total
    closed = traits(schedule).makespan
    if exact or closed is None:
        return _executed(schedule, ranks, m, vpp)
    return closed(ranks, m, vpp)


def _executed(schedule: str, ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    from hetpar.schedules import ChunkTimes, execute

    sched = build(schedule, len(ranks), m, vpp)
    per = [ranks[r] for r in placement(schedule, len(ranks), vpp)]
    times = ChunkTimes(
        forward=[r.fwd / vpp for r in per], backward=[r.bwd / vpp for r in per],
        weight=[r.wgt / vpp for r in per],
    )
    return execute(sched, times).makespan


def in_flight_chunks(schedule: str, pp: int, m: int, vpp: int, rank: int) -> int:
    """Most (chunk, micro-batch) activations rank ``rank`` stashes at once.

    The schedule's closed form when it declares one (``Traits.in_flight``), else counted
    from its action lists, held until W (the delayed W still needs the layer inputs).
    """
    closed = traits(schedule).in_flight
    if closed is not None:
        return closed(pp, m, vpp, rank)
    return in_flight(build(schedule, pp, m, vpp), until="W")[rank]


def in_flight_layers(
    schedule: str, pp: int, m: int, vpp: int, rank: int, layers: tuple[int, ...]
) -> float:
    """Most layer-activations (layers x micro-batches) rank ``rank`` stashes at once;
    ``layers``: the layer count of every model chunk (``pp * vpp``, in model order, on the
    ranks ``hetpar.schedules.placement`` gives).

    Chunks of equal size on the rank: ``in_flight_chunks`` x that size. Otherwise (padded
    or uneven splits, e.g. Llama 3's embedding-only first chunk) the peak of the weighted
    count along the rank's action list, since which chunks are in flight at the peak matters:
    Megatron's warm-up runs micro-batch groups of pp through local chunk 0, 1, ... in turn
    (Narayanan et al. SC'21 Sec. 2.2.2), so rank 0 of 126 layers as 16 x 8 chunks holds 16
    micro-batches of its empty chunk among its 143 in flight.
    """
    where = placement(schedule, pp, vpp)
    own = [n for n, r in zip(layers, where, strict=True) if r == rank]
    if min(own) == max(own):
        return float(in_flight_chunks(schedule, pp, m, vpp, rank) * own[0])
    return _weighted(schedule, pp, m, vpp, layers)[rank]


@lru_cache(maxsize=256)
def _weighted(schedule: str, pp: int, m: int, vpp: int,
              layers: tuple[int, ...]) -> tuple[float, ...]:
    return in_flight_weighted(build(schedule, pp, m, vpp), layers, until="W")
