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
    hence exported as ``allreduce:tree``, specs/collectives.py)."""
    lines = algo.nccl_lines(shape.levels, op, shape.library)
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
    """``levels`` under a network model: scale-out levels at its achieved fraction, and with
    ``ring_per_gpu`` each at one GPU's share: NCCL's ring crosses a level's boundary once per
    rank below it (``nccl._capacity``), the per-GPU model as many times as there are ranks
    below, so the level's per-GPU bandwidth is divided by them."""
    out, below = [], 1
    for i, lv in enumerate(levels):
        path = lv.path
        if lv.size > 1 and scale_out(path, i == len(levels) - 1):
            bw = path.bandwidth * app.scale_out_efficiency / (below if app.ring_per_gpu else 1)
            path = replace(path, bandwidth=bw)
        out.append(Level(lv.size, path))
        below *= lv.size
    return tuple(out)
