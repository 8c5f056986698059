"""Random failure and repair events over a pool of GPUs, and the states they lead through."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetpar.failures.rates import FailureRates


@dataclass(frozen=True)
class Trace:
    """Failure (+1) and repair (-1) events on the GPUs of ``units`` units of ``unit_size``.

    ``states[i]`` holds the failed GPUs per unit during [times[i], times[i+1]) (the last
    state lasts until ``horizon_s``); ``states[0]`` is the failure-free start. ``hit[i]`` says
    whether event i (which starts state i+1) was a failure, and ``unit[i]`` which unit it hit.
    """

    times: np.ndarray
    states: np.ndarray
    hit: np.ndarray
    unit: np.ndarray
    horizon_s: float
    unit_size: int

    @property
    def durations(self) -> np.ndarray:
        """Seconds each state lasts."""
        return np.diff(np.append(self.times, self.horizon_s))

    def failed_fraction(self, units: int) -> np.ndarray:
        """Fraction of the first ``units`` units' GPUs that are down, per state."""
        return self.states[:, :units].sum(axis=1) / (units * self.unit_size)


def generate(rates: FailureRates, units: int, unit_size: int, days: float,
             rng: np.random.Generator, warmup_days: float = 0.0) -> Trace:
    """Events of independent per-GPU failure processes (one Poisson process per class).

    Failures land on GPUs uniformly at random; one that lands on a GPU already down is dropped
    (thinning), so each GPU fails at the class rate only while it is up. Every failure is
    repaired after a duration drawn from its class's repair distribution. The trace starts with
    no GPU down unless ``warmup_days`` of failures are simulated first and dropped.
    """
    gpus = units * unit_size
    warm = warmup_days * 86400.0
    horizon = days * 86400.0 + warm
    times, gpu, repair = [], [], []
    for c in rates.classes:
        count = rng.poisson(rates.class_rate(c) * gpus * horizon)
        times.append(rng.uniform(0.0, horizon, count))
        gpu.append(rng.integers(0, gpus, count))
        repair.append(c.repair.sample(rng, count))
    t, g, r = (np.concatenate(x) for x in (times, gpu, repair))
    order = np.argsort(t, kind="stable")
    t, g, r = t[order], g[order], r[order]
    down_until: dict[int, float] = {}
    keep = np.zeros(len(t), dtype=bool)
    for i in range(len(t)):  # thinning needs the events in order; a few thousand at most
        gi = int(g[i])
        if down_until.get(gi, -1.0) <= t[i]:
            keep[i] = True
            down_until[gi] = t[i] + r[i]
    t, g, r = t[keep], g[keep], r[keep]
    ev_t = np.concatenate([t, t + r])
    ev_u = np.concatenate([g, g]) // unit_size
    ev_d = np.concatenate([np.ones(len(t), np.int64), -np.ones(len(t), np.int64)])
    inside = ev_t < horizon
    ev_t, ev_u, ev_d = ev_t[inside], ev_u[inside], ev_d[inside]
    # repairs before failures at equal times keep counts non-negative
    order = np.lexsort((ev_d, ev_t))
    ev_t, ev_u, ev_d = ev_t[order], ev_u[order], ev_d[order]
    states = np.zeros((len(ev_t) + 1, units), dtype=np.int16)
    for i in range(len(ev_t)):
        states[i + 1] = states[i]
        states[i + 1, ev_u[i]] += ev_d[i]
    assert (states >= 0).all()
    first = int(np.searchsorted(ev_t, warm))  # events before the start only set the state
    return Trace(times=np.append(0.0, ev_t[first:] - warm), states=states[first:],
                 hit=ev_d[first:] > 0, unit=ev_u[first:], horizon_s=horizon - warm,
                 unit_size=unit_size)


def place(failed: int, units: int, unit_size: int, rng: np.random.Generator) -> np.ndarray:
    """Failed GPUs per unit when ``failed`` GPUs out of all are chosen uniformly at random."""
    gpus = rng.choice(units * unit_size, size=failed, replace=False)
    return np.bincount(gpus // unit_size, minlength=units).astype(np.int16)
