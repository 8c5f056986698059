"""Fit measured collective and send times to the simulator's alpha-beta form, per network level.

The simulator prices a ring collective on one level of ``n`` ranks as
``t = c_lat x latency + c_bw x bytes / bandwidth`` (``collectives.ring_lines``: c_lat = phases x
(n-1) steps, c_bw = phases x (n-1)/n; Patarasuk & Yuan 2009) and a point-to-point send as
``latency + bytes / bandwidth`` (``sim/network.py::p2p``). The fit minimises the sum of squared
*log* residuals ``(log model - log t)^2``: timing noise is multiplicative (a rank that loses its
CPU for a while slows a 64-byte and a 64-MiB call alike), a 64-byte point weighs as much as a
64-MiB one (plain residuals would let the largest sizes decide everything), and a model 2x too
fast costs as much as one 2x too slow, as the bus-bandwidth ratio validate-collectives reports
sees them. Both forms are linear in (latency, 1/bandwidth): the start is the closed-form
least-squares fit of relative residuals ``(model - t) / t``, refined by Gauss-Newton steps
(halved until the sum falls; latency kept >= 0). Points on the model give it back exactly.
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
    statistic: str = "min"
    """Which repetition stands for the point: ``min`` (the fabric's floor: on a shared host the
    slower repetitions include waiting for a CPU, which is load, not network) or ``median``
    (the typical one)."""

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
    return lines[0].a, lines[0].b


Row = tuple[float, float, float]
"""(c_lat, c_bw x bytes, t): one point's coefficients and its time."""


def _lsq(rows: Sequence[Row], w: Sequence[float], pin: bool) -> tuple[float, float]:
    """(x, y) minimising sum (w (c x + d y - t))^2 (a 2x2 normal system); ``pin``: x = 0."""
    s11 = sum((c * k) ** 2 for (c, _, _), k in zip(rows, w, strict=True))
    s12 = sum(c * d * k * k for (c, d, _), k in zip(rows, w, strict=True))
    s22 = sum((d * k) ** 2 for (_, d, _), k in zip(rows, w, strict=True))
    r1 = sum(c * t * k * k for (c, _, t), k in zip(rows, w, strict=True))
    r2 = sum(d * t * k * k for (_, d, t), k in zip(rows, w, strict=True))
    det = s11 * s22 - s12 * s12
    if not pin and det > 1e-12 * s11 * s22:
        return (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
    return 0.0, (r2 / s22 if s22 > 0 else 0.0)


def _log_cost(rows: Sequence[Row], lat: float, u: float) -> float:
    return sum(math.log((c * lat + d * u) / t) ** 2 for c, d, t in rows)


def _start(rows: Sequence[Row]) -> tuple[float, float]:
    """The closed-form fit of relative residuals ((c L + d u - t) / t), with L >= 0."""
    w = [1 / t for _, _, t in rows]
    lat, u = _lsq(rows, w, pin=False)
    return (lat, u) if lat >= 0 else _lsq(rows, w, pin=True)


def solve(rows: Sequence[Row]) -> tuple[float, float]:
    """(latency s, seconds per byte) minimising sum log((c_lat L + c_bw u) / t)^2 over rows
    (c_lat, c_bw x bytes, t), with L >= 0; ConfigError where no bandwidth is measurable."""
    lat, u = _start(rows)
    if not (u > 0 and math.isfinite(u)):
        raise ConfigError("the measured times do not grow with size, so no bandwidth can be "
                          "fitted; allowed: sizes up to at least 1 MiB (--max-bytes)")
    cost = _log_cost(rows, lat, u)
    for _ in range(200):
        # Gauss-Newton: log m_i moves by (c dL + d du) / m_i, fitted to log(t_i / m_i)
        m = [c * lat + d * u for c, d, _ in rows]
        lin = [(c, d, mi * math.log(t / mi)) for (c, d, t), mi in zip(rows, m, strict=True)]
        w = [1 / mi for mi in m]
        better = None
        for pin in (False, True):  # the full step, else bandwidth alone (L held)
            dl, du = _lsq(lin, w, pin)
            scale = 1.0
            while scale > 1e-9 and better is None:
                nl, nu = max(lat + scale * dl, 0.0), u + scale * du
                if nu > 0 and _log_cost(rows, nl, nu) < cost:
                    better = (nl, nu)
                scale /= 2
            if better:
                break
        if better is None:
            break  # no step lowers the sum: the minimum (within float precision)
        lat, u = better
        cost = _log_cost(rows, lat, u)
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
    _check_reach(use, level, lat, u)
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


def _check_reach(points: Sequence[Point], level: str, lat: float, u: float) -> None:
    """The sweep must reach the bandwidth-bound regime: at its largest size the bytes term is
    at least the latency term, i.e. the size is at least Hockney's half-performance length
    n1/2 = latency / (seconds per byte) (Hockney, Parallel Computing 20, 1994), else the fitted
    bandwidth is whatever keeps a latency-only line straight (1e9 Gbit/s has been seen)."""
    big = max(points, key=lambda p: p.size_bytes)
    c, d = coefficients(big.op, big.ranks)
    if d * big.size_bytes * u < c * lat:
        need = c * lat / (d * u)
        raise ConfigError(f"level {level}: the largest size ({big.size_bytes} B) is below the "
                          f"half-bandwidth size ({need:.3g} B for {big.op}), so no bandwidth is "
                          f"measured; allowed: --max-bytes >= {need:.3g}")


def bus_bandwidth(p: Point) -> float:
    """nccl-tests bus bandwidth of a point's time (its statistic), bytes/s (doc/PERFORMANCE.md: the
    algorithm bandwidth times 2(n-1)/n for all-reduce, (n-1)/n for gather and scatter)."""
    _, d = coefficients(p.op, p.ranks)
    return p.size_bytes / p.time_s * d
