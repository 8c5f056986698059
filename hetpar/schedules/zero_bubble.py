"""ZB-H1 (Qi et al., ICLR'24, "Zero Bubble Pipeline Parallelism", sec 2.1)."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.schedules.base import Action, RankTimes, Traits, register, require_vpp1


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
    # ZB-H2, ZB-1p, ZB-2p and ZB-V split B and W the same way and fill more of the bubble
    # (Qi et al. 2024), so ZB-H1's time bounds theirs from above.
    stands_for=("zb-h2", "zb-1p", "zb-2p", "zbv"),
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
