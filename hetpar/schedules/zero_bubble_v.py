"""ZB-V: the V-shaped zero-bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism",
arXiv 2401.10241 Sec. 6), two chunks per rank at 1F1B's activation memory."""

from __future__ import annotations

from hetpar.errors import Infeasible
from hetpar.schedules.base import Action, Traits, rank_of
from hetpar.schedules.registry import register


def v_order(pp: int, m: int, rank: int) -> list[Action]:
    """Rank ``rank``'s actions in the handcrafted ZB-V order (Qi et al. Sec. 6).

    The phases as PyTorch's ScheduleZBVZeroBubble (torch/distributed/pipelining/schedules.py)
    lays them out, with ``a`` the rank's first chunk (``rank``) and ``b`` its second
    (2 pp - 1 - rank): 2 (pp - rank) - 1 forwards of ``a``; ``rank`` pairs F(b), F(a);
    pp - rank triples F(b), B(b), W(b); then the steady state F(a), B(a), W(a), F(b), B(b),
    W(b) until every forward ran; then ``rank`` pairs B(a), B(b) and pp - rank pairs B(a),
    W(a), and the remaining W of ``b``, then of ``a``. The order is written for at least
    2 pp - 1 micro-batches; with fewer, the actions of the missing ones are dropped (each
    action depends only on its own micro-batch, so the rest stays a valid order).
    """
    n = max(2 * pp - 1, m)
    a, b = rank, 2 * pp - 1 - rank
    count = {(k, c): 0 for k in "FBW" for c in (a, b)}
    out: list[Action] = []

    def put(kind: str, chunk: int) -> None:
        mb = count[(kind, chunk)]
        count[(kind, chunk)] += 1
        if mb < m:
            out.append(Action(kind=kind, chunk=chunk, microbatch=mb))  # type: ignore[arg-type]

    for _ in range(2 * (pp - rank) - 1):
        put("F", a)
    for _ in range(rank):
        put("F", b)
        put("F", a)
    for _ in range(pp - rank):
        for kind in "FBW":
            put(kind, b)
    while count[("F", b)] < count[("F", a)] or count[("F", a)] < n:
        if count[("F", a)] < n:
            put("F", a)
        for chunk, kinds in ((a, "BW"), (b, "FBW")):
            for kind in kinds:
                put(kind, chunk)
    for _ in range(rank):
        put("B", a)
        put("B", b)
    for _ in range(pp - rank):
        put("B", a)
        put("W", a)
    for chunk in (b, a):
        while count[("W", chunk)] < count[("B", chunk)]:
            put("W", chunk)
    return out


def _v_ok(pp: int, vpp: int) -> None:
    """Infeasible unless one V: two chunks per rank on at least two ranks."""
    if vpp != 2 or pp < 2:
        raise Infeasible("schedule", f"zbv needs vpp = 2 chunks (a V) and pp >= 2, "
                                     f"got pp={pp}, vpp={vpp}")
    assert rank_of(pp, pp, "v") == pp - 1  # the turn is on the last rank


@register("zbv", Traits(
    chunks="v", min_pp=2, splits_backward=True, in_flight_bounded=True,
    # in flight: counted from the lists (held until W). With m >= 2 pp - 1 micro-batches every
    # rank peaks at 2 pp half-stage stashes, 1F1B's pp whole-stage ones; with fewer, the ranks
    # differ (tests/test_schedules.py)
    # no closed form: the executor times it (the README's table gives a bubble rate of 0 when
    # F = B = W; tests/test_schedules_zbv.py measures what this order leaves)
))
def zbv(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """ZB-V for ``pp`` ranks and ``m`` micro-batches (vpp must be 2: one V)."""
    _v_ok(pp, vpp)
    return [v_order(pp, m, r) for r in range(pp)]
