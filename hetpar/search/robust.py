"""Robust choice: each plan's prediction interval, P(#1 beats #2), low quantiles, reorderings.

A plan's predicted iteration time is split by the simulator's breakdown into compute-like
time C (compute, recompute, bubble: all scale with the GPUs' achieved efficiency), network
time N (tp, cp, pp and dp communication: scales with 1 / bandwidth) and the rest R
(optimizer, fixed overhead). Two errors the cost model can make are shared by every plan
it ranks: the compute efficiency (factor f_c on C) and the network bandwidth (f_n on N), so
T = f_c C + f_n N + R to first order (exposed times; overlap is taken as it was predicted).
On top, each plan has its own residual error, log-normal with the simulator's relative
prediction interval. A plan with more of its time on the network has a wider interval, and
two plans that share their compute/network mix reorder rarely whatever the factors do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from hetpar.errors import ConfigError
from hetpar.search.costmodel import Evaluation
from hetpar.sim import breakdown

GRID = 8
"""Points per factor of the scenario grid (8 x 8, log-spaced midpoints)."""
Z = tuple(NormalDist().inv_cdf((j + 0.5) / 9) for j in range(9))
"""Standard-normal quantiles sampling each plan's own residual (9 equal-probability bins)."""


@dataclass(frozen=True, kw_only=True)
class Uncertainty:
    """How wrong the cost model may be. The ranges are those of the "why #1 won" report."""

    sim_interval: float = 0.12
    """Half-width of the simulator's 80% prediction interval, relative (used when the
    evaluation carries no interval of its own). Default: the development set's MAPE of
    7.6% (docs/simulator.md) read as normal errors: sigma = 7.6% / sqrt(2/pi) = 9.5%,
    80% half-width = 1.2816 sigma = 12%."""
    network: float = 0.5
    """Network bandwidth may be off by this fraction either way."""
    compute: float = 0.15
    """Compute efficiency may be off by this fraction either way."""
    quantile: float = 0.1
    """The low quantile of tokens/s that ``--objective robust`` maximises."""

    def __post_init__(self) -> None:
        for k, hi in (("sim_interval", 1.0), ("network", 0.95), ("compute", 0.95)):
            v = getattr(self, k)
            if not 0.0 <= v < hi:
                raise ConfigError(f"uncertainty: {k} must be in [0, {hi}), got {v}")
        if not 0.0 < self.quantile < 0.5:
            raise ConfigError(f"uncertainty: quantile must be in (0, 0.5), got {self.quantile}")

    def factors(self) -> list[tuple[float, float]]:
        """(f_c, f_n) scenarios: log-uniform over the ranges, time factors = 1 / rate."""
        fc = _log_grid(1 / (1 + self.compute), 1 / (1 - self.compute))
        fn = _log_grid(1 / (1 + self.network), 1 / (1 - self.network))
        return [(c, n) for c in fc for n in fn]


def _log_grid(lo: float, hi: float) -> list[float]:
    a, b = math.log(lo), math.log(hi)
    return [math.exp(a + (b - a) * (i + 0.5) / GRID) for i in range(GRID)]


@dataclass(frozen=True)
class Parts:
    """A plan's iteration time split as the module docstring says (seconds)."""

    compute: float
    network: float
    rest: float
    tokens: float
    sigma: float
    """Log-sd of the plan's own residual."""

    def time(self, fc: float, fn: float) -> float:
        return fc * self.compute + fn * self.network + self.rest


def parts(ev: Evaluation, u: Uncertainty) -> Parts:
    """Split ``ev`` by its breakdown (all of it compute-like when it has none)."""
    bd = ev.breakdown
    t = ev.iteration_time_s
    ts = breakdown.terms()  # each key's uncertainty follows its kind
    c = sum(bd.get(k.key, 0.0) for k in ts if k.kind == "compute")
    n = sum(bd.get(k.key, 0.0) for k in ts if k.kind == "network")
    if not bd:
        c = t
    rest = max(0.0, t - c - n)
    return Parts(c, n, rest, ev.tokens_per_s * t, _sigma(ev, u))


def _sigma(ev: Evaluation, u: Uncertainty) -> float:
    """Log-sd from the evaluation's own 80% interval of tokens/s when the simulator gives
    one (``tokens_per_s_interval`` in its report), else from ``u.sim_interval``."""
    iv = ev.report.get("tokens_per_s_interval") if ev.report else None
    z80 = NormalDist().inv_cdf(0.9)
    if isinstance(iv, list | tuple) and len(iv) == 2 and 0 < iv[0] <= iv[1]:
        return math.log(iv[1] / iv[0]) / (2 * z80)
    return math.log(1 + u.sim_interval) / z80


def samples(ev: Evaluation, u: Uncertainty) -> list[float]:
    """Tokens/s over the scenario grid times the residual quantiles (equal weights)."""
    p = parts(ev, u)
    return [p.tokens / (p.time(fc, fn) * math.exp(p.sigma * z))
            for fc, fn in u.factors() for z in Z]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of equally weighted ``values`` (linear interpolation)."""
    v = sorted(values)
    x = q * (len(v) - 1)
    i = int(x)
    return v[i] + (v[min(i + 1, len(v) - 1)] - v[i]) * (x - i)


def interval(ev: Evaluation, u: Uncertainty, level: float = 0.8) -> tuple[float, float]:
    """Central ``level`` interval of the plan's tokens/s."""
    s = samples(ev, u)
    return quantile(s, (1 - level) / 2), quantile(s, (1 + level) / 2)


def robust_score(ev: Evaluation, u: Uncertainty) -> float:
    """The ``u.quantile`` low quantile of tokens/s (what ``--objective robust`` ranks by)."""
    return quantile(samples(ev, u), u.quantile)


def p_beats(a: Evaluation, b: Evaluation, u: Uncertainty) -> float:
    """Probability that plan ``a`` is faster than ``b``: the shared factors move both
    (averaged over the grid), the residuals are independent per plan."""
    pa, pb = parts(a, u), parts(b, u)
    total = 0.0
    scenarios = u.factors()
    for fc, fn in scenarios:
        gap = math.log(pa.tokens / pa.time(fc, fn)) - math.log(pb.tokens / pb.time(fc, fn))
        sd = math.hypot(pa.sigma, pb.sigma)
        total += NormalDist().cdf(gap / sd) if sd > 0 else float(gap > 0)
    return total / len(scenarios)
