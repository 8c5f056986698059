"""Zero-bubble schedules (Qi et al., ICLR'24, "Zero Bubble Pipeline Parallelism"): the
handcrafted ZB-H1 (Sec. 2.1) and the memory-limited greedy ZB-1p / ZB-2p (Sec. 3)."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.schedules.base import Action, RankTimes, Traits
from hetpar.schedules.registry import register, require_vpp1


def _zb_h1_makespan(ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    """ZB-H1 shortens 1F1B's fill/drain to F + B - W per rank (Qi et al. 2024, Sec. 2.1)."""
    totals = [r.total for r in ranks]
    slow = max(totals)
    fill = [max(r.fwd + r.bwd - r.wgt, 0.0) for r in ranks]
    i = totals.index(slow)
    return m * slow + sum(fill) - fill[i]


# No export target names it: Megatron-LM, torchtitan and DeepSpeed have no one-chunk-per-rank
# ZB-H1 (torchtitan's zero-bubble schedules are looped or V-shaped).
@register("zb-h1", Traits(
    splits_backward=True, makespan=_zb_h1_makespan,
    fill=lambda vpp: 1.0 / 3.0,  # about a third of 1F1B's fill remains (Qi et al., Table 2)
    # The delayed W still needs the layer inputs, so every rank holds pp (ibid. Table 1).
    in_flight=lambda pp, m, vpp, rank: min(m, pp), in_flight_bounded=True,
))
def zb_h1(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """ZB-H1: 1F1B's forward/backward order with the backward split into B and W.

    Rank r runs 1F1B's pp-r-1 warm-up forwards, then F, B pairs, but starts its W passes
    r steps late (the paper delays W "based on the number of warm-up microbatches", so every
    rank holds pp microbatches until their W). The deferred W's fill the cool-down gaps
    where 1F1B idles waiting for gradients, and a B no longer waits for the next rank's W.
    Activations awaiting B stay at 1F1B's pp-r per rank.

    Bubble (derived for m >= pp, uniform stages, TW <= min(TF, TB), p2p = 0):
    (pp-1)(TF+TB-TW), against 1F1B's (pp-1)(TF+TB+TW) -- a third of it when TF=TB=TW,
    as the paper's Fig. 3 states.
    """
    require_vpp1("zb-h1", vpp)
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action(kind="F", chunk=r, microbatch=i) for i in range(warm)]
        w_next = 0
        for i in range(m - warm):
            acts.append(Action(kind="F", chunk=r, microbatch=warm + i))
            acts.append(Action(kind="B", chunk=r, microbatch=i))
            if i >= r:  # the W of microbatch i-r: r steps late
                acts.append(Action(kind="W", chunk=r, microbatch=w_next))
                w_next += 1
        for i in range(m - warm, m):  # cool-down: each B is followed by a deferred W
            acts.append(Action(kind="B", chunk=r, microbatch=i))
            acts.append(Action(kind="W", chunk=r, microbatch=w_next))
            w_next += 1
        acts += [Action(kind="W", chunk=r, microbatch=j) for j in range(w_next, m)]
        out.append(acts)
    return out


def greedy_zero_bubble(pp: int, m: int, limit: int) -> list[list[Action]]:
    """Per-rank order of a zero-bubble pipeline under an activation-memory limit.

    Qi et al. 2024 Sec. 3 schedule automatically: each rank runs as many forwards as its
    memory limit allows (activations are held from F until W), a B as soon as its gradient
    arrives, and a deferred W whenever neither F nor B can run. This is that heuristic on unit
    times (F = B = W, no p2p), which is how the paper's ZB-H1 / ZB-H2 are drawn (its Figs. 3-4);
    the executor then times the order with the real F, B, W and p2p. ``limit`` counts micro-
    batches per rank: pp is 1F1B's peak on rank 0 (ZB-1p), 2 pp twice it (ZB-2p).
    """
    done: dict[tuple[str, int, int], int] = {}  # (kind, rank, microbatch) -> end tick
    nxt_f, nxt_b = [0] * pp, [0] * pp
    wait_w: list[list[int]] = [[] for _ in range(pp)]
    held = [0] * pp
    out: list[list[Action]] = [[] for _ in range(pp)]
    tick, left = 0, 3 * pp * m
    while left:
        for r in range(pp):
            act = _pick(r, pp, m, limit, tick, done, nxt_f, nxt_b, wait_w, held)
            if act is not None:
                done[(act.kind, r, act.microbatch)] = tick + 1
                out[r].append(act)
                left -= 1
        tick += 1
    return out


def _pick(r: int, pp: int, m: int, limit: int, tick: int, done: dict[tuple[str, int, int], int],
          nxt_f: list[int], nxt_b: list[int], wait_w: list[list[int]],
          held: list[int]) -> Action | None:
    """The action rank ``r`` starts at ``tick``: B before F before W (Qi et al. Sec. 3)."""
    def ready(key: tuple[str, int, int]) -> bool:
        return done.get(key, tick + 1) <= tick

    b = nxt_b[r]
    if b < nxt_f[r] and ready(("F", r, b)) and (r == pp - 1 or ready(("B", r + 1, b))):
        nxt_b[r] += 1
        wait_w[r].append(b)
        return Action(kind="B", chunk=r, microbatch=b)
    f = nxt_f[r]
    if f < m and held[r] < limit and (r == 0 or ready(("F", r - 1, f))):
        nxt_f[r] += 1
        held[r] += 1
        return Action(kind="F", chunk=r, microbatch=f)
    if wait_w[r] and ready(("B", r, wait_w[r][0])):
        held[r] -= 1
        return Action(kind="W", chunk=r, microbatch=wait_w[r].pop(0))
    return None


def _zb_2p_makespan(ranks: Sequence[RankTimes], m: int, vpp: int) -> float:
    """ZB-H2 / ZB-2p: with twice 1F1B's activations the paper reshapes the pipeline into a
    parallelogram, and once the optimizer step is no synchronisation point (its post-update
    validation, Qi et al. 2024 Sec. 4) consecutive iterations overlap, leaving a bubble of
    F + B - 2W per other rank (ibid. Table 2: (p - 1)(TF + TB - 2TW)). The executor times one
    iteration alone (``greedy_zero_bubble``), an upper bound that does not overlap them."""
    totals = [r.total for r in ranks]
    slow = max(totals)
    fill = [max(r.fwd + r.bwd - 2 * r.wgt, 0.0) for r in ranks]
    i = totals.index(slow)
    return m * slow + sum(fill) - fill[i]


# Qi et al.'s automatic schedules under 1x and 2x 1F1B's activation memory; their stash is
# counted from the action lists.
@register("zb-1p", Traits(
    splits_backward=True, in_flight_bounded=True,
    # every rank fills its limit before its first W (tests/test_sim_pipeline.py checks the lists)
    in_flight=lambda pp, m, vpp, rank: min(pp, m),
    # at 1F1B's memory the automatic schedule reaches ZB-H1's bubble (Qi et al. Sec. 3, Table 2)
    makespan=_zb_h1_makespan, fill=lambda vpp: 1.0 / 3.0,
))
def zb_1p(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """ZB-1p: the greedy zero-bubble order at 1F1B's peak activation memory (pp)."""
    require_vpp1("zb-1p", vpp)
    return greedy_zero_bubble(pp, m, pp)


@register("zb-2p", Traits(
    splits_backward=True, in_flight_bounded=True, makespan=_zb_2p_makespan,
    in_flight=lambda pp, m, vpp, rank: min(2 * pp, m),
    # ZB-H2 (the handcrafted schedule at 2 pp - 1 stashes) fills no more than ZB-2p
    stands_for=("zb-h2",),
))
def zb_2p(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """ZB-2p: the greedy zero-bubble order at twice 1F1B's peak activation memory (2 pp)."""
    require_vpp1("zb-2p", vpp)
    return greedy_zero_bubble(pp, m, 2 * pp)
