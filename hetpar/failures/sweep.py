"""Throughput loss versus the fraction of failed GPUs (placed at random), and closed forms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetpar.errors import ConfigError
from hetpar.failures.policies import Evaluator
from hetpar.failures.trace import place


def healthy_fraction(p: float, n: int) -> float:
    """Expected fraction of units of n GPUs with no failed GPU when a fraction p is down: (1-p)^n.

    Each GPU is down independently with probability p (Arfeen et al. 2025, Fig. 3).
    """
    return (1.0 - p) ** n


def drop_loss(p: float, n: int, k: int) -> float:
    """Throughput lost by dropping every replica of k units of n GPUs that holds a failure.

    A replica survives only if all its n k GPUs are up: loss = 1 - (1-p)^(n k).
    """
    return 1.0 - (1.0 - p) ** (n * k)


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """Mean (and standard deviation) of the throughput loss per policy at each failed fraction."""

    fractions: tuple[float, ...]
    samples: int
    loss: dict[str, list[float]] = field(default_factory=dict)
    loss_std: dict[str, list[float]] = field(default_factory=dict)
    batch: dict[str, list[float]] = field(default_factory=dict)
    healthy_units: list[float] = field(default_factory=list)
    """Measured mean fraction of the plan's units without a failed GPU."""


def sweep(ev: Evaluator, fractions: tuple[float, ...], *, samples: int, seed: int,
          policies: tuple[str, ...], pool_units: int, block: int = 1,
          tick: Callable[[], object] | None = None) -> SweepResult:
    """For each failed fraction p, ``samples`` random placements of round(p x GPUs) failures
    (in aligned blocks of ``block`` GPUs: the blast radius of one failure); ``tick`` is called
    after each placement (a progress bar)."""
    bad = [p for p in fractions if not 0.0 <= p <= 1.0]
    if bad:
        raise ConfigError(f"failed fraction {bad[0]} not allowed; allowed: 0..1")
    if samples < 1 or block < 1:
        raise ConfigError(f"samples {samples} / block {block} not allowed; allowed: >= 1")
    lay = ev.lay
    rng = np.random.default_rng(seed)
    gpus = pool_units * lay.tp
    res = SweepResult(fractions=tuple(fractions), samples=samples)
    rows: dict[str, list[list[float]]] = {p: [] for p in policies}
    bats: dict[str, list[list[float]]] = {p: [] for p in policies}
    for frac in fractions:
        got: dict[str, list[float]] = {p: [] for p in policies}
        bat: dict[str, list[float]] = {p: [] for p in policies}
        healthy = []
        for _ in range(samples):
            counts = place(round(frac * gpus), pool_units, lay.tp, rng, block)
            healthy.append(float(np.mean(counts[: lay.units] == 0)))
            for p in policies:
                out = ev.evaluate(p, counts)
                got[p].append(1.0 - out.throughput)
                bat[p].append(out.batch)
            if tick is not None:
                tick()
        res.healthy_units.append(float(np.mean(healthy)))
        for p in policies:
            rows[p].append(got[p])
            bats[p].append(bat[p])
    for p in policies:
        res.loss[p] = [float(np.mean(r)) for r in rows[p]]
        res.loss_std[p] = [float(np.std(r)) for r in rows[p]]
        res.batch[p] = [float(np.mean(r)) for r in bats[p]]
    return res
