"""Monte Carlo over days of failures and repairs: throughput over time, goodput, spares needed."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetpar.errors import ConfigError
from hetpar.failures.policies import PACKED, Evaluator
from hetpar.failures.rates import FailureRates
from hetpar.failures.trace import Trace, generate
from hetpar.workers import Pool


@dataclass(frozen=True, kw_only=True)
class RestartCost:
    """What a job interruption costs: restart time and the work lost since the last checkpoint."""

    restart_s: float = 600.0
    """Time to restart the job (reschedule, load the checkpoint, rebuild communicators)."""
    checkpoint_write_s: float = 30.0
    """Time the job stalls to write a checkpoint."""
    checkpoint_interval_s: float | None = None
    """None: Young's optimum sqrt(2 x write x MTBF) (Young 1974, CACM 17(9))."""

    def __post_init__(self) -> None:
        if self.restart_s < 0 or self.checkpoint_write_s < 0:
            raise ConfigError("restart cost: restart_s and checkpoint_write_s must be >= 0")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ConfigError(
                f"restart cost: checkpoint_interval_s {self.checkpoint_interval_s}; allowed: > 0"
            )

    def interval(self, mtbf_s: float) -> float:
        """Checkpoint interval in seconds for a job whose failures come every ``mtbf_s``."""
        if self.checkpoint_interval_s is not None:
            return self.checkpoint_interval_s
        return math.sqrt(2 * max(self.checkpoint_write_s, 1e-9) * mtbf_s)


@dataclass(frozen=True, kw_only=True)
class PolicyRun:
    """One policy over one trace."""

    throughput: np.ndarray
    """Fraction of the fault-free throughput in each state of the trace."""
    mean: float
    goodput: float
    """Useful tokens over fault-free tokens, after restarts, lost work and checkpoint writes."""
    loss_percentiles: dict[str, float]
    spares_needed: int | None
    """Least spare units that keep the global batch in every state; None: more than tried."""
    boosted_max: int = 0
    """Most units boosted at once (ntp-boost)."""
    boost_power: float = 0.0
    """Time-average extra power of the boosted units, in nominal GPU powers."""


@dataclass(frozen=True, kw_only=True)
class MonteCarloResult:
    trace: Trace
    pool_units: int
    plan_units: int
    checkpoint_interval_s: float
    runs: dict[str, PolicyRun] = field(default_factory=dict)

    @property
    def hours(self) -> np.ndarray:
        return self.trace.times / 3600.0

    def failed_fraction(self) -> np.ndarray:
        return self.trace.failed_fraction(self.pool_units)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray,
                         qs: tuple[float, ...] = (50, 90, 99, 100)) -> dict[str, float]:
    """Time-weighted percentiles of ``values`` (``weights`` = how long each value lasts)."""
    order = np.argsort(values)
    v, w = values[order], np.cumsum(weights[order])
    w = w / w[-1]
    idx = [min(int(np.searchsorted(w, q / 100 - 1e-12)), len(v) - 1) for q in qs]
    return {f"p{q:g}": float(v[i]) for q, i in zip(qs, idx, strict=True)}


def histograms(trace: Trace, units: int, n: int) -> np.ndarray:
    """Units with 0..n failed GPUs among the first ``units``, in every state of ``trace``.

    Built incrementally (each event moves one unit between two bins), O(events x n).
    """
    states = trace.states
    first = np.bincount(np.minimum(states[0, :units], n), minlength=n + 1)
    idx = np.arange(len(trace.unit))
    inside = trace.unit < units
    u = np.where(inside, trace.unit, 0)
    old = np.minimum(states[idx, u], n)
    new = np.minimum(states[idx + 1, u], n)
    delta = np.zeros((len(idx), n + 1), dtype=np.int64)
    np.add.at(delta, (idx[inside], old[inside]), -1)
    np.add.at(delta, (idx[inside], new[inside]), 1)
    return np.vstack([first, first + np.cumsum(delta, axis=0)])


def _outcomes(ev: Evaluator, policy: str, trace: Trace, units: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(throughput, batch, boosted units, boost power) of ``policy`` in every state, on the
    trace's first ``units`` units."""
    if policy in PACKED:
        # identical failure histograms give identical outcomes: evaluate each once
        n = ev.lay.tp
        uniq, inv = np.unique(histograms(trace, units, n), axis=0, return_inverse=True)
        outs = [ev.evaluate(policy, np.repeat(np.arange(n + 1), row)) for row in uniq]
        inv = inv.ravel()
    else:
        outs = [ev.evaluate(policy, s) for s in trace.states[:, :units]]
        inv = np.arange(len(outs))
    cols = [np.array([getattr(o, f) for o in outs])[inv]
            for f in ("throughput", "batch", "boosted", "power")]
    return cols[0], cols[1], cols[2], cols[3]


def spares_needed(ev: Evaluator, policy: str, trace: Trace, base_units: int) -> int | None:
    """Least spare units (beyond the plan's) that keep the global batch in every state."""
    if policy == "drop":
        return 0 if not trace.hit.any() else None
    lay_units = ev.lay.units
    most = trace.states.shape[1] - lay_units

    def keeps(spares: int) -> bool:
        bat = _outcomes(ev, policy, trace, lay_units + spares)[1]
        return bool((bat >= 1 - 1e-9).all())

    if not keeps(most):
        return None
    lo, hi = 0, most
    while lo < hi:  # keeping the batch is monotone in the number of spares
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if keeps(mid) else (mid + 1, hi)
    return lo


def _goodput(thr: np.ndarray, trace: Trace, plan_units: int, cost: RestartCost,
             interval: float) -> float:
    """Time-average throughput less interruptions: every failure in a plan unit costs the
    throughput of the moment x (restart + half a checkpoint interval of lost work); a repair
    that raises throughput costs a restart (the job re-plans to use it)."""
    dur = trace.durations
    total = float((thr * dur).sum())
    before, after = thr[:-1], thr[1:]
    fail = trace.interrupt & (trace.unit < plan_units)
    lost = (before * fail).sum() * (cost.restart_s + interval / 2)
    lost += (after * (~trace.hit & (after > before + 1e-12))).sum() * cost.restart_s
    write = cost.checkpoint_write_s
    useful = max(total - lost, 0.0) * interval / (interval + write)
    return useful / trace.horizon_s


@dataclass(frozen=True)
class _Work:
    """What every worker running a policy over the trace needs (shipped once per worker)."""

    ev: Evaluator
    trace: Trace
    pool_units: int
    cost: RestartCost
    interval: float


def _policy_run(work: _Work, policy: str) -> PolicyRun:
    """One policy over the whole trace: throughput, goodput, loss percentiles, spares."""
    ev, trace, plan_units = work.ev, work.trace, work.ev.lay.units
    dur = trace.durations
    thr, _, boosted, power = _outcomes(ev, policy, trace, work.pool_units)
    return PolicyRun(
        throughput=thr, mean=float((thr * dur).sum() / trace.horizon_s),
        goodput=_goodput(thr, trace, plan_units, work.cost, work.interval),
        loss_percentiles=weighted_percentiles(1 - thr, dur),
        spares_needed=spares_needed(ev, policy, trace, plan_units),
        boosted_max=int(boosted.max()),
        boost_power=float((power * dur).sum() / trace.horizon_s),
    )


def run(ev: Evaluator, rates: FailureRates, *, days: float, seed: int, policies: tuple[str, ...],
        pool_units: int, cost: RestartCost | None = None, spare_search: int | None = None,
        warmup_days: float = 0.0, tick: Callable[[], object] | None = None,
        pool: Pool | None = None) -> MonteCarloResult:
    """Monte Carlo of ``days`` of failures on ``pool_units`` units (plan units + idle spares).

    The trace covers ``spare_search`` more units (default: enough for several times the mean
    number of failed GPUs) so that the least number of spares each policy needs can be found.
    The trace is drawn here from ``seed``; the policies run over it on ``pool`` (default:
    this process), one task each, so the result does not depend on the pool.
    """
    if days <= 0 or warmup_days < 0:
        raise ConfigError(f"days {days} / warmup {warmup_days} not allowed; allowed: > 0 / >= 0")
    cost = cost or RestartCost()
    lay = ev.lay
    rng = np.random.default_rng(seed)
    n = lay.tp
    mean_failed = rates.mean_failed_fraction() * lay.units * n
    extra = spare_search
    if extra is None:
        extra = int(6 * mean_failed) + 4 * lay.units_per_replica
    units = max(pool_units, lay.units + extra)
    trace = generate(rates, units, n, days, rng, warmup_days)
    mtbf = 1.0 / max(rates.per_gpu_day / 86400.0 * lay.units * n, 1e-30)
    interval = cost.interval(mtbf)
    res = MonteCarloResult(trace=trace, pool_units=pool_units, plan_units=lay.units,
                           checkpoint_interval_s=interval)
    work = _Work(ev, trace, pool_units, cost, interval)
    # tick: one policy done (a progress bar)
    runs = (pool or Pool()).map(_policy_run, list(policies), work, tick)
    res.runs.update(zip(policies, runs, strict=True))
    return res
