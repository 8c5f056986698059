"""Fit measured collective and send times to the simulator's alpha-beta form, per network level.

The simulator prices a ring collective on one level of ``n`` ranks as
``t = c_lat x latency + c_bw x bytes / bandwidth`` (``collectives.ring_lines``: c_lat = phases x
(n-1) steps, c_bw = phases x (n-1)/n; Patarasuk & Yuan 2009) and a point-to-point send as
``latency + bytes / bandwidth`` (``sim/network.py::p2p``). Both are linear in (latency,
1/bandwidth), so the fit is a weighted linear least-squares problem with a closed form: it
minimises the sum of squared *relative* residuals ``((model - t) / t)^2``, so a 64-byte point
weighs as much as a 64-MiB one (plain residuals would let the largest sizes decide everything).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetpar.errors import ConfigError
from hetpar.net.collectives import Level, Path, ring_lines
from hetpar.net.links import load_link_kind

OPS = ("p2p", "all_reduce", "all_gather", "reduce_scatter")
STATISTICS = ("median", "min")
"""What the probe measures; ``p2p`` is one send between two ranks (a pipeline send)."""
KIND = "measured"
"""The link kind a fitted level is written with (``catalog/links/measured.toml``)."""


@dataclass(frozen=True, kw_only=True)
class Point:
    """One operation size measured on one communicator: seconds per repetition.

    ``size_bytes`` is nccl-tests' size: the full (unsharded) bytes for all-gather and
    reduce-scatter, the message for all-reduce and a send.
    """

    level: str
    """The network level the communicator spans: ``scale-up`` (ranks of one node) or
    ``network`` (one rank per node)."""
    op: str
    ranks: int
    size_bytes: int
    seconds: tuple[float, ...]
    statistic: str = "median"
    """Which repetition stands for the point: ``median`` (the typical one: what a job sees) or
    ``min`` (the fabric's floor: on a shared host the slower repetitions include waiting for a
    CPU, which is load, not network)."""

    @property
    def time_s(self) -> float:
        return min(self.seconds) if self.statistic == "min" else statistics.median(self.seconds)


def coefficients(op: str, ranks: int) -> tuple[float, float]:
    """(c_lat, c_bw) of ``op`` on ``ranks`` ranks: seconds = c_lat x latency + c_bw x bytes /
    bandwidth, read off the simulator's own ring line on a unit path of the measured kind."""
    if op == "p2p":
        return 1.0, 1.0  # sim/network.py p2p: latency + bytes / bandwidth
    kind = load_link_kind(KIND)
    lines = ring_lines([Level(ranks, Path("fit", 1.0, 1.0, kind))], op)
    assert len(lines) == 1, "the measured kind has one protocol"
    return lines[0]


def solve(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(latency s, seconds per byte) minimising sum ((c_lat L + c_bw u - t) / t)^2 over rows
    (c_lat, c_bw x bytes, t), with L >= 0; ConfigError where no bandwidth is measurable."""
    # residual_i = x_i . (L, u) - 1 with x_i = (c_lat, c_bw x bytes) / t: normal equations
    s11 = sum((c / t) ** 2 for c, _, t in rows)
    s12 = sum(c * d / t**2 for c, d, t in rows)
    s22 = sum((d / t) ** 2 for _, d, t in rows)
    r1 = sum(c / t for c, _, t in rows)
    r2 = sum(d / t for _, d, t in rows)
    det = s11 * s22 - s12 * s12
    if det > 1e-12 * s11 * s22:
        lat, u = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
    else:
        lat, u = -1.0, 0.0
    if lat < 0:  # all the time is bandwidth (or one size): fit u alone through the origin
        lat, u = 0.0, (r2 / s22 if s22 > 0 else 0.0)
    if not (u > 0 and math.isfinite(u)):
        raise ConfigError("the measured times do not grow with size, so no bandwidth can be "
                          "fitted; allowed: sizes up to at least 1 MiB (--max-bytes)")
    return lat, u


@dataclass(frozen=True, kw_only=True)
class LevelFit:
    """A level's fitted latency (per ring step) and bandwidth (per GPU, per direction)."""

    level: str
    ops: tuple[str, ...]
    latency_s: float
    bandwidth_bytes_s: float
    points: int
    residual_mape_pct: float
    """Mean |model - time| / time over the fitted points (times: each point's statistic)."""
    latency_range_s: tuple[float, float]
    """The smallest and largest latency of a fit to each repetition alone (the spread)."""
    repetitions: int
    """Repetitions whose own fit found a bandwidth (the ranges are over these)."""
    bandwidth_range_bytes_s: tuple[float, float]

    def predict_s(self, p: Point) -> float:
        c, d = coefficients(p.op, p.ranks)
        return c * self.latency_s + d * p.size_bytes / self.bandwidth_bytes_s


def _rows(points: Sequence[Point], rep: int | None) -> list[tuple[float, float, float]]:
    out = []
    for p in points:
        c, d = coefficients(p.op, p.ranks)
        t = p.time_s if rep is None else p.seconds[rep]
        out.append((c, d * p.size_bytes, max(t, 1e-9)))
    return out


def fit_level(points: Sequence[Point], level: str, ops: Sequence[str]) -> LevelFit:
    """Fit ``level`` to its points of ``ops`` (each point's statistic), and each repetition
    alone for the spread; ConfigError naming the level and ops with fewer than two sizes."""
    use = [p for p in points if p.level == level and p.op in ops]
    if len({p.size_bytes for p in use}) < 2:
        raise ConfigError(f"level {level}: {len(use)} points of {', '.join(ops)}; the fit "
                          "needs at least two sizes (--min-bytes < --max-bytes)")
    lat, u = solve(_rows(use, None))
    per = []
    for r in range(min(len(p.seconds) for p in use)):
        try:
            per.append(solve(_rows(use, r)))
        except ConfigError:
            continue  # one repetition too noisy for a bandwidth: the spread says so (reps)
    ok, per = len(per), per or [(lat, u)]
    fit = LevelFit(level=level, ops=tuple(o for o in OPS if o in ops), latency_s=lat,
                   bandwidth_bytes_s=1 / u, points=len(use), residual_mape_pct=0.0,
                   repetitions=ok,
                   latency_range_s=(min(x[0] for x in per), max(x[0] for x in per)),
                   bandwidth_range_bytes_s=(min(1 / x[1] for x in per),
                                            max(1 / x[1] for x in per)))
    err = [abs(fit.predict_s(p) - p.time_s) / p.time_s for p in use]
    return replace(fit, residual_mape_pct=100 * statistics.fmean(err))


def bus_bandwidth(p: Point) -> float:
    """nccl-tests bus bandwidth of a point's time (its statistic), bytes/s (doc/PERFORMANCE.md: the
    algorithm bandwidth times 2(n-1)/n for all-reduce, (n-1)/n for gather and scatter)."""
    _, d = coefficients(p.op, p.ranks)
    return p.size_bytes / p.time_s * d
