"""Random failure and repair events over a pool of GPUs, and the states they lead through."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetpar.errors import ConfigError
from hetpar.failures.rates import FailureRates


@dataclass(frozen=True)
class Trace:
    """Failure (+1) and repair (-1) events on the GPUs of ``units`` units of ``unit_size``.

    ``states[i]`` holds the failed GPUs per unit during [times[i], times[i+1]) (the last
    state lasts until ``horizon_s``); ``states[0]`` is the failure-free start. ``hit[i]`` says
    whether event i (which starts state i+1) was a GPU going down, and ``unit[i]`` which unit.
    """

    times: np.ndarray
    states: np.ndarray
    hit: np.ndarray
    unit: np.ndarray
    horizon_s: float
    unit_size: int
    interrupt: np.ndarray
    """Whether event i is the first GPU of a failure event (one job interruption)."""

    @property
    def durations(self) -> np.ndarray:
        """Seconds each state lasts."""
        return np.diff(np.append(self.times, self.horizon_s))

    def failed_fraction(self, units: int) -> np.ndarray:
        """Fraction of the first ``units`` units' GPUs that are down, per state."""
        return self.states[:, :units].sum(axis=1) / (units * self.unit_size)


MAX_EVENTS = 200_000
"""Failure events one Monte Carlo may draw (its event loop is Python: ~1 s per 100k)."""


def generate(rates: FailureRates, units: int, unit_size: int, days: float,
             rng: np.random.Generator, warmup_days: float = 0.0) -> Trace:
    """Events of independent per-GPU failure processes (one Poisson process per class).

    Failures land on GPUs uniformly at random and take down the aligned block of the class's
    ``gpus_per_event`` GPUs around it (1: the GPU alone); GPUs of the block already down stay
    as they are (thinning), so each GPU fails at the class rate only while it is up. Every
    failure is repaired after a duration drawn from its class's repair distribution. The trace
    starts with no GPU down unless ``warmup_days`` of failures are simulated first and dropped.
    """
    gpus = units * unit_size
    warm = warmup_days * 86400.0
    horizon = days * 86400.0 + warm
    expected = sum(rates.class_rate(c) for c in rates.classes) * gpus * horizon
    if not expected <= MAX_EVENTS:  # also catches nan from a broken rates file
        raise ConfigError(
            f"rates {rates.name!r}: {expected:.3g} failures expected over {days + warmup_days:g} "
            f"days on {gpus} GPUs; at most {MAX_EVENTS:,} can be simulated (fewer --days or a "
            "smaller --rate-scale)")
    times, gpu, repair, block = [], [], [], []
    for c in rates.classes:
        count = rng.poisson(rates.class_rate(c) * gpus * horizon)
        times.append(rng.uniform(0.0, horizon, count))
        gpu.append(rng.integers(0, gpus, count))
        repair.append(c.repair.sample(rng, count))
        block.append(np.full(count, c.gpus_per_event))
    t, g, r, b = (np.concatenate(x) for x in (times, gpu, repair, block))
    order = np.argsort(t, kind="stable")
    down_until: dict[int, float] = {}
    ev: list[tuple[float, int, int, bool]] = []  # time, gpu, +1/-1, starts an interruption
    for i in order:  # thinning needs the events in order; a few thousand at most
        start = int(g[i]) - int(g[i]) % int(b[i])
        first = True
        for gi in range(start, min(start + int(b[i]), gpus)):
            if down_until.get(gi, -1.0) <= t[i]:
                down_until[gi] = t[i] + r[i]
                ev += [(t[i], gi, 1, first), (t[i] + r[i], gi, -1, False)]
                first = False
    arr = np.array([e[:3] for e in ev], dtype=float).reshape(-1, 3)
    new = np.array([e[3] for e in ev], dtype=bool)
    inside = arr[:, 0] < horizon
    arr, new = arr[inside], new[inside]
    # repairs before failures at equal times keep counts non-negative
    order = np.lexsort((arr[:, 2], arr[:, 0]))
    ev_t, new = arr[order, 0], new[order]
    ev_u, ev_d = arr[order, 1].astype(np.int64) // unit_size, arr[order, 2].astype(np.int64)
    states = np.zeros((len(ev_t) + 1, units), dtype=np.int16)
    for i in range(len(ev_t)):
        states[i + 1] = states[i]
        states[i + 1, ev_u[i]] += ev_d[i]
    assert (states >= 0).all()
    first_ev = int(np.searchsorted(ev_t, warm))  # events before the start only set the state
    return Trace(times=np.append(0.0, ev_t[first_ev:] - warm), states=states[first_ev:],
                 hit=ev_d[first_ev:] > 0, unit=ev_u[first_ev:], horizon_s=horizon - warm,
                 unit_size=unit_size, interrupt=new[first_ev:])


def place(failed: int, units: int, unit_size: int, rng: np.random.Generator,
          block: int = 1) -> np.ndarray:
    """Failed GPUs per unit when ``failed`` GPUs out of all are chosen uniformly at random,
    in aligned blocks of ``block`` GPUs (round(failed / block) blocks)."""
    blocks = rng.choice(units * unit_size // block, size=round(failed / block), replace=False)
    gpus = (blocks[:, None] * block + np.arange(block)).ravel()
    return np.bincount(gpus // unit_size, minlength=units).astype(np.int16)
