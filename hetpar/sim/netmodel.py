"""A communicator's NCCL lines as a plan forces them, and its levels under a network model."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hetpar.net import collectives as algo
from hetpar.net.collectives import Level, Path
from hetpar.specs.collectives import Applied

if TYPE_CHECKING:
    from hetpar.sim.network import GroupShape


def forced_lines(shape: GroupShape, op: str) -> list[algo.Line]:
    """NCCL's lines for ``op`` on ``shape``, only the forced algorithm's / protocol's where
    the collective has any (NCCL_ALGO=Ring covers every collective; the tree only all-reduce,
    hence exported as ``allreduce:tree``, specs/collectives.py); with ``shape.per_gpu``
    over ``per_gpu`` levels (a network model's flat per-GPU ring).

    Memoized on the fields read here: equal shapes of other topologies (a new cluster state
    of the replay keeps most communicators' levels) share the table."""
    key = (shape.levels, op, shape.library, shape.force, shape.per_gpu)
    hit = _LINES.get(key)
    if hit is None:
        if len(_LINES) > MAX_LINES:
            _LINES.clear()
        hit = _LINES[key] = tuple(_forced_lines(shape, op))
    return list(hit)


MAX_LINES = 50_000
"""Line tables kept (a few lines of a few floats each)."""
_LINES: dict[tuple[object, ...], tuple[algo.Line, ...]] = {}


def _forced_lines(shape: GroupShape, op: str) -> list[algo.Line]:
    levels = per_gpu(shape.levels) if shape.per_gpu else shape.levels
    lines = algo.nccl_lines(levels, op, shape.library)
    name, proto = shape.force
    for keep in ((lambda ln: ln.algorithm == name) if name != "auto" else None,
                 (lambda ln: ln.protocol == proto) if proto != "auto" else None):
        if keep is not None and any(keep(ln) for ln in lines):
            lines = [ln for ln in lines if keep(ln)]
    return envelope(lines)


def envelope(lines: list[algo.Line]) -> list[algo.Line]:
    """The lines that are cheapest for some message size: drop a line that another one
    without a size correction is never slower than (a correction only slows a line)."""
    return [x for i, x in enumerate(lines) if not any(
        j != i and y.corr is None and y.a <= x.a and y.b <= x.b
        and (y.a < x.a or y.b < x.b or j < i) for j, y in enumerate(lines))]


def scale_out(path: Path, outermost: bool) -> bool:
    """Whether ``path`` joins nodes (its link kind says; a plain path: the outermost level)."""
    return path.kind.scale_out if path.kind else outermost


def scaled(path: Path, app: Applied) -> Path:
    """``path`` at the network model's achieved fraction when it joins nodes."""
    if app.scale_out_efficiency == 1.0 or not scale_out(path, True):
        return path
    return replace(path, bandwidth=path.bandwidth * app.scale_out_efficiency)


def model_levels(levels: tuple[Level, ...], app: Applied) -> tuple[Level, ...]:
    """``levels`` with their scale-out links at the network model's achieved fraction."""
    if app.scale_out_efficiency == 1.0:
        return levels
    return tuple(Level(lv.size, replace(lv.path, bandwidth=lv.path.bandwidth
                                        * app.scale_out_efficiency))
                 if lv.size > 1 and scale_out(lv.path, i == len(levels) - 1) else lv
                 for i, lv in enumerate(levels))


def per_gpu(levels: tuple[Level, ...]) -> tuple[Level, ...]:
    """``levels`` as a flat per-GPU ring sees them (``NetworkModel.ring_per_gpu``): NCCL's
    rings cross a scale-out level's boundary once per rank below it (``nccl._capacity``
    multiplies the per-GPU bandwidth by them), the per-GPU model once per GPU, each at its own
    share: the level's bandwidth divided by the ranks below. Only NCCL's flat call is priced
    so; a hierarchical sync already sends each GPU's shard over its own share."""
    out, below = [], 1
    for i, lv in enumerate(levels):
        if lv.size > 1 and below > 1 and scale_out(lv.path, i == len(levels) - 1):
            lv = Level(lv.size, replace(lv.path, bandwidth=lv.path.bandwidth / below))
        out.append(lv)
        below *= lv.size
    return tuple(out)
