"""Monte Carlo: traces, determinism, Little's law, goodput and the spares each policy needs."""

from __future__ import annotations

import numpy as np
import pytest
from test_failures_policies import LinearCost, lay

from hetpar.errors import ConfigError
from hetpar.failures import montecarlo
from hetpar.failures.policies import Evaluator
from hetpar.failures.rates import load_rates
from hetpar.failures.trace import generate

POLICIES = ("drop", "drop-packed", "spare", "checkpoint", "ntp", "ntp-boost")


def _run(seed=0, days=10.0, scale=4.0, **kw):
    la = lay(n=32, k=8, replicas=32)
    ev = Evaluator(la, LinearCost(32))
    rates = load_rates("llama3").scaled(scale)
    return montecarlo.run(ev, rates, days=days, seed=seed, policies=POLICIES,
                          pool_units=la.units, **kw)


def test_trace_states_follow_events():
    rates = load_rates("llama3-3day").scaled(20)
    t = generate(rates, 64, 8, 30.0, np.random.default_rng(2))
    assert (t.states >= 0).all() and t.states[0].sum() == 0
    assert np.all(np.diff(t.times) >= 0) and t.times[-1] < t.horizon_s
    steps = np.diff(t.states.astype(int), axis=0)
    assert (np.abs(steps).sum(axis=1) == 1).all()
    assert ((steps.sum(axis=1) > 0) == t.hit).all()
    assert (steps.argmax(axis=1)[t.hit] == t.unit[t.hit]).all()


def test_mean_down_gpus_obey_littles_law():
    rates = load_rates("llama3-3day").scaled(10)
    t = generate(rates, 256, 8, 400.0, np.random.default_rng(4), warmup_days=10)
    down = (t.failed_fraction(256) * t.durations).sum() / t.horizon_s
    # thinning (a down GPU cannot fail again) lowers it by about the failed fraction itself
    assert down == pytest.approx(rates.mean_failed_fraction(), rel=0.08)


def test_deterministic_for_a_seed():
    a, b, c = _run(seed=5), _run(seed=5), _run(seed=6)
    assert np.array_equal(a.trace.times, b.trace.times)
    for p in POLICIES:
        assert np.array_equal(a.runs[p].throughput, b.runs[p].throughput)
        assert a.runs[p].spares_needed == b.runs[p].spares_needed
    assert not np.array_equal(a.trace.times, c.trace.times)


def test_policy_order_and_spares():
    r = _run()
    mean = {p: r.runs[p].mean for p in POLICIES}
    assert mean["drop"] <= mean["drop-packed"] <= mean["ntp"] <= mean["ntp-boost"] <= 1.0
    assert r.runs["drop"].spares_needed is None  # drop never uses spares
    need = {p: r.runs[p].spares_needed for p in POLICIES[1:]}
    assert need["ntp-boost"] <= need["ntp"] <= need["drop-packed"] == need["checkpoint"]
    for p in POLICIES:
        assert r.runs[p].goodput <= r.runs[p].mean + 1e-12


def test_found_spares_keep_the_batch_and_one_fewer_does_not():
    r = _run(seed=1)
    la = lay(n=32, k=8, replicas=32)
    ev = Evaluator(la, LinearCost(32))
    s = r.runs["drop-packed"].spares_needed
    assert s is not None and s > 0
    for spares, ok in ((s, True), (s - 1, False)):
        states = r.trace.states[:, : la.units + spares]
        kept = all(ev.evaluate("drop-packed", st).batch >= 1 - 1e-9 for st in states)
        assert kept is ok


def test_restart_costs_lower_goodput():
    free = _run(cost=montecarlo.RestartCost(restart_s=0, checkpoint_write_s=0,
                                            checkpoint_interval_s=1.0))
    dear = _run(cost=montecarlo.RestartCost(restart_s=3600))
    for p in ("drop-packed", "ntp"):
        assert free.runs[p].goodput == pytest.approx(free.runs[p].mean, rel=1e-3)
        assert dear.runs[p].goodput < free.runs[p].goodput


def test_bad_days_is_a_config_error():
    with pytest.raises(ConfigError, match="days"):
        _run(days=0)


def test_weighted_percentiles():
    q = montecarlo.weighted_percentiles(np.array([0.0, 1.0]), np.array([3.0, 1.0]))
    assert q["p50"] == 0.0 and q["p90"] == 1.0 and q["p100"] == 1.0


def test_incremental_histograms_match_direct_counts():
    t = generate(load_rates("llama3").scaled(30), 200, 8, 20.0, np.random.default_rng(7),
                 warmup_days=5)
    for units in (150, 200):
        direct = np.stack([(np.minimum(t.states[:, :units], 8) == f).sum(axis=1)
                           for f in range(9)], axis=1)
        assert np.array_equal(montecarlo.histograms(t, units, 8), direct)


def test_blast_radius_takes_down_aligned_blocks():
    rates = load_rates("llama3").scaled(30).with_blast(4)
    t = generate(rates, 128, 32, 10.0, np.random.default_rng(8))
    down = t.hit.sum()
    assert down == 4 * t.interrupt.sum()  # no overlaps at this rate: whole blocks each time
    gpu_steps = np.diff(t.states.astype(int), axis=0).sum(axis=1)
    assert set(np.unique(gpu_steps)) <= {-1, 1}
    # the four GPUs of a block go down at the same instant, in the same unit
    starts = np.flatnonzero(t.interrupt)
    for i in starts[:20]:
        assert (t.times[i + 1: i + 5] == t.times[i + 1]).all() and len(set(t.unit[i:i + 4])) == 1
    assert rates.mean_failed_fraction() == pytest.approx(4 * load_rates("llama3").scaled(30)
                                                         .mean_failed_fraction())


def test_block_placement():
    from hetpar.failures.trace import place

    c = place(40, 64, 32, np.random.default_rng(0), block=8)
    assert c.sum() == 40 and set(np.unique(c)) <= {0, 8, 16, 24, 32}
