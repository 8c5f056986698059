"""Closed forms the random placement must reproduce: healthy domains and replica drops."""

from __future__ import annotations

import numpy as np
import pytest
from test_failures_policies import LinearCost, lay

from hetpar.failures.policies import Evaluator
from hetpar.failures.sweep import drop_loss, healthy_fraction, sweep
from hetpar.failures.trace import place


def test_tp64_at_one_per_mille_keeps_about_94_percent_of_domains():
    # Arfeen et al. 2025, Fig. 3: TP64 with 0.1% of GPUs failed leaves ~94% of domains usable
    assert healthy_fraction(0.001, 64) == pytest.approx(0.938, abs=5e-4)


@pytest.mark.parametrize("n, p", [(64, 0.001), (32, 0.004), (8, 0.01)])
def test_random_placement_matches_healthy_fraction(n, p):
    units = 32768 // n
    rng = np.random.default_rng(1)
    got = np.mean([np.mean(place(round(p * units * n), units, n, rng) == 0) for _ in range(200)])
    # failures drawn without replacement: (1-p)^n up to O(1/GPUs); 200 x 512+ units of noise
    assert got == pytest.approx(healthy_fraction(p, n), abs=2e-3)


@pytest.mark.parametrize("n, k, p", [(32, 8, 0.001), (32, 8, 0.004), (8, 4, 0.01)])
def test_drop_without_packing_loses_closed_form(n, k, p):
    la = lay(n=n, k=k, replicas=4096 // k)
    ev = Evaluator(la, LinearCost(n))
    res = sweep(ev, (p,), samples=60, seed=3, policies=("drop",), pool_units=la.units)
    assert res.batch["drop"][0] == pytest.approx(1 - drop_loss(p, n, k), abs=0.01)
    assert res.healthy_units[0] == pytest.approx(healthy_fraction(p, n), abs=3e-3)


def test_packing_loses_ceil_of_failed_domains_over_k():
    la = lay(n=32, k=8, replicas=128)
    ev = Evaluator(la, LinearCost(32))
    rng = np.random.default_rng(5)
    for _ in range(20):
        c = place(131, la.units, 32, rng)
        failed = int(np.count_nonzero(c))
        assert ev.evaluate("drop-packed", c).batch == pytest.approx(
            (128 - -(-failed // 8)) / 128)


def test_sweep_is_deterministic_and_monotone():
    la = lay(n=32, k=8, replicas=64)
    ev = Evaluator(la, LinearCost(32))
    kw = dict(samples=20, seed=9, policies=("drop-packed", "ntp"), pool_units=la.units)
    a = sweep(ev, (0.001, 0.003), **kw)
    b = sweep(ev, (0.001, 0.003), **kw)
    assert a.loss == b.loss
    assert a.loss["drop-packed"][0] < a.loss["drop-packed"][1]
    assert all(x < y for x, y in zip(a.loss["ntp"], a.loss["drop-packed"], strict=True))
