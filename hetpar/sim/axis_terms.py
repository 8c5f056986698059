"""What the simulator charges a plan-scope axis: its registered ``AxisCost``, read generically."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetpar.sim import network as net
from hetpar.sim.axis_costs import AxisLayer, Charged
from hetpar.sim.profile import DEFAULT, FrameworkProfile
from hetpar.specs.model import ModelSpec

Costed = Sequence[tuple[Charged, int]]
"""``sim.axis_costs.costed(plan)``: the plan-scope axes with a cost and a degree > 1."""


def held_elsewhere(model: ModelSpec, layers: tuple[int, int], axes: Costed) -> float:
    """Parameters of layers [start, end) that the costed axes' groups hold on their other
    ranks: ``sharded_params`` x (1 - 1 / degree), before TP (0.0 without such an axis)."""
    cut = 0.0
    for a, d in axes:
        if a.cost.sharded_params:
            shard = a.cost.sharded_params
            cut += sum(shard(model, i) for i in range(*layers)) * (1 - 1 / d)
    return cut


def comm(axes: Costed, shapes: Mapping[str, Mapping[int, net.GroupShape]], rank: int,
         model: ModelSpec, layers: tuple[int, int], tokens: int, tp: int, element_bytes: int,
         recompute: str, profile: FrameworkProfile = DEFAULT,
         beside: tuple[float, float] = (0.0, 0.0),
         sm_count: int | None = None, share: float = 1.0) -> dict[str, tuple[float, float]]:
    """Per costed axis (by breakdown key): (forward, backward) seconds of its collectives in
    one chunk (layers [start, end), ``tokens`` per GPU) for one micro-batch, layer by layer,
    on its group of pipeline rank ``rank``; full recompute repeats the forward's. Less what
    the framework hides (``AxisCost.overlap``) behind another micro-batch's compute: per
    layer, ``AxisCost.hidden`` of its collectives beside ``beside`` = (attention block, MLP)
    forward seconds of one layer (their backward twice that); a hidden second still costs
    ``overlap_sms`` / ``sm_count`` of a second: the compute beside it runs on the other SMs.
    ``share``: ``AxisLayer.share``."""
    out: dict[str, tuple[float, float]] = {}
    for a, d in axes:
        c, shape = a.cost, shapes[a.name][rank]
        run = net.collective(c.op)
        own = c.time
        one = hid = 0.0
        for i in range(*layers):
            lay = AxisLayer(model=model, layer=i, tokens=tokens, tp=tp, degree=d,
                            element_bytes=element_bytes, share=share)
            t = own(shape, lay, profile) if own else run(shape, c.nbytes(lay))
            one += t
            if c.overlap and t > 0:  # without a stated pairing: the layer's whole compute
                hid += (c.hidden(t, *beside) if c.hidden
                        else min(sum(c.calls) * t, 3 * sum(beside)))
        fwd, bwd = c.calls
        f, b = fwd * one, (bwd + (fwd if recompute == "full" else 0)) * one
        if c.overlap and f + b > 0:
            sms = c.overlap_sms(profile) if c.overlap_sms else 0
            gain = 1 - (min(1.0, sms / sm_count) if sms and sm_count else 0.0)
            cut = gain * c.overlap(profile) * min(hid, f + b)
            f, b = f - cut * f / (f + b), b - cut * b / (f + b)
        out[c.key] = (f, b)
    return out
