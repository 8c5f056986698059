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
         compute: float = 0.0, share: float = 1.0) -> dict[str, tuple[float, float]]:
    """Per costed axis (by breakdown key): (forward, backward) seconds of its collectives in
    one chunk (layers [start, end), ``tokens`` per GPU) for one micro-batch, layer by layer,
    on its group of pipeline rank ``rank``; full recompute repeats the forward's. Less what
    the framework hides (``AxisCost.overlap``), at most ``compute``: the chunk's compute
    seconds for one micro-batch, beside which another micro-batch's collectives run.
    ``share``: ``AxisLayer.share``."""
    out: dict[str, tuple[float, float]] = {}
    for a, d in axes:
        c, shape = a.cost, shapes[a.name][rank]
        run = net.collective(c.op)
        own = c.time
        one = 0.0
        for i in range(*layers):
            lay = AxisLayer(model=model, layer=i, tokens=tokens, tp=tp, degree=d,
                            element_bytes=element_bytes, share=share)
            one += own(shape, lay, profile) if own else run(shape, c.nbytes(lay))
        fwd, bwd = c.calls
        f, b = fwd * one, (bwd + (fwd if recompute == "full" else 0)) * one
        if c.overlap and f + b > 0:
            keep = 1 - c.overlap(profile) * min(f + b, compute) / (f + b)
            f, b = f * keep, b * keep
        out[c.key] = (f, b)
    return out
