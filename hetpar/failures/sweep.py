"""Throughput loss versus the fraction of failed GPUs (placed at random), and closed forms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetpar.errors import ConfigError
from hetpar.failures.policies import Evaluator
from hetpar.failures.trace import place
from hetpar.workers import Pool


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


BATCH = 4096
"""Placements drawn, then evaluated, at a time: bounds memory at 100,000 samples."""


@dataclass(frozen=True)
class _Work:
    """What every worker evaluating placements needs (shipped once per worker)."""

    ev: Evaluator
    policies: tuple[str, ...]


def _evaluate(work: _Work, counts: np.ndarray) -> list[tuple[float, float]]:
    """(throughput, batch) of every policy for one placement."""
    outs = [work.ev.evaluate(p, counts) for p in work.policies]
    return [(o.throughput, o.batch) for o in outs]


def sweep(ev: Evaluator, fractions: tuple[float, ...], *, samples: int, seed: int,
          policies: tuple[str, ...], pool_units: int, block: int = 1,
          tick: Callable[[], object] | None = None, pool: Pool | None = None) -> SweepResult:
    """For each failed fraction p, ``samples`` random placements of round(p x GPUs) failures
    (in aligned blocks of ``block`` GPUs: the blast radius of one failure); ``tick`` is called
    after each placement (a progress bar).

    The placements are drawn here, in order from one generator seeded with ``seed``, and
    evaluated on ``pool`` (default: this process): the result does not depend on the pool."""
    bad = [p for p in fractions if not 0.0 <= p <= 1.0]
    if bad:
        raise ConfigError(f"failed fraction {bad[0]} not allowed; allowed: 0..1")
    if samples < 1 or block < 1:
        raise ConfigError(f"samples {samples} / block {block} not allowed; allowed: >= 1")
    lay = ev.lay
    rng = np.random.default_rng(seed)
    gpus = pool_units * lay.tp
    pool = pool or Pool()
    work = _Work(ev, tuple(policies))
    res = SweepResult(fractions=tuple(fractions), samples=samples,
                      loss={p: [] for p in policies}, loss_std={p: [] for p in policies},
                      batch={p: [] for p in policies})
    for frac in fractions:
        outs: list[list[tuple[float, float]]] = []
        healthy = []
        for start in range(0, samples, BATCH):
            batch = [place(round(frac * gpus), pool_units, lay.tp, rng, block)
                     for _ in range(min(BATCH, samples - start))]
            healthy += [float(np.mean(c[: lay.units] == 0)) for c in batch]
            outs += pool.map(_evaluate, batch, work, tick)
        res.healthy_units.append(float(np.mean(healthy)))
        for i, p in enumerate(policies):
            loss = [1.0 - o[i][0] for o in outs]
            res.loss[p].append(float(np.mean(loss)))
            res.loss_std[p].append(float(np.std(loss)))
            res.batch[p].append(float(np.mean([o[i][1] for o in outs])))
    return res
