"""Policies on hand-made failure patterns, with a linear replica cost so results are exact."""

from __future__ import annotations

import numpy as np
import pytest

from hetpar.errors import ConfigError
from hetpar.failures.layout import Layout
from hetpar.failures.policies import Evaluator, PolicyConfig, default_degrees
from hetpar.failures.power import PowerCurve


class LinearCost:
    """Replica time = batch x n / tp / speed (pure compute, shards spread over survivors)."""

    def __init__(self, n: int, sync: float = 0.0) -> None:
        self.n, self.sync = n, sync

    def replica_time(self, tp: int, batch: int, speed: float = 1.0) -> float:
        return batch * self.n / tp / speed

    def sync_time(self, degrees: frozenset[int], replicas: int) -> float:
        return self.sync * (self.n / min(degrees))


def lay(n: int = 32, k: int = 8, replicas: int = 16, batch: int = 8, spares: int = 0) -> Layout:
    return Layout(group="g", domain_size=n, tp=n, units_per_replica=k, replicas=replicas,
                  spare_units=spares, batch_per_replica=batch, micro_batch=1, pp=k, vpp=1)


def counts(layout: Layout, failed: dict[int, int], extra: int = 0) -> np.ndarray:
    c = np.zeros(layout.units + extra, dtype=np.int16)
    for u, f in failed.items():
        c[u] = f
    return c


def test_default_degrees_follow_the_paper():
    assert default_degrees(32) == (30, 28)
    assert default_degrees(8) == (6,)
    assert default_degrees(64) == (62, 60, 58, 56)


def test_ntp_batch_share_keeps_pace():
    ev = Evaluator(lay(), LinearCost(32))
    # 8 x 32/30 = 8.53 > 8 but 7 x 32/30 = 7.47 <= 8; 7 x 32/28 = 8.0 exactly keeps pace
    assert ev.bmax[30] == 7 and ev.bmax[28] == 7
    assert ev.degree_of[1] == ev.degree_of[2] == 30
    assert ev.degree_of[3] == ev.degree_of[4] == 28
    assert ev.degree_of[5] == 0


def test_drop_versus_packing():
    la = lay()
    ev = Evaluator(la, LinearCost(32))
    # one failed GPU in unit 0 of each of replicas 0, 1, 2 (units 0, 8, 16)
    c = counts(la, {0: 1, 8: 1, 16: 1})
    assert ev.evaluate("drop", c).throughput == pytest.approx(13 / 16)
    assert ev.evaluate("drop-packed", c).throughput == pytest.approx(15 / 16)
    ntp = ev.evaluate("ntp", c)  # packed into one replica at TP30 with 7 of 8 sequences
    assert ntp.batch == pytest.approx((15 * 8 + 7) / 128)
    boost = ev.evaluate("ntp-boost", c)
    assert boost.batch == 1.0 and boost.boosted == 3
    assert ev.evaluate("checkpoint", c).throughput == 0.0


def test_nine_degraded_units_need_two_replicas():
    la = lay()
    ev = Evaluator(la, LinearCost(32))
    c = counts(la, {8 * i: 1 for i in range(9)})
    assert ev.evaluate("drop-packed", c).batch == pytest.approx(14 / 16)
    assert ev.evaluate("ntp", c).batch == pytest.approx((14 * 8 + 2 * 7) / 128)


def test_dead_unit_is_dropped_by_ntp():
    la = lay()
    ev = Evaluator(la, LinearCost(32))
    c = counts(la, {0: 6})  # 26 survivors: below the lowest NTP degree (28)
    assert ev.evaluate("ntp", c).batch == pytest.approx(15 / 16)


def test_spares_replace_failed_units():
    la = lay(spares=2)
    ev = Evaluator(la, LinearCost(32))
    c = counts(la, {0: 1, 8: 1, 16: 1}, extra=2)
    assert ev.evaluate("spare", c).batch == pytest.approx(15 / 16)  # two of three swapped
    assert ev.evaluate("drop-packed", c).batch == pytest.approx(15 / 16)  # 127 healthy units
    assert ev.evaluate("checkpoint", c).throughput == 0.0
    c = counts(la, {0: 1, 8: 1}, extra=2)
    assert ev.evaluate("spare", c).batch == 1.0
    assert ev.evaluate("drop-packed", c).batch == 1.0
    assert ev.evaluate("checkpoint", c).throughput == 1.0
    c[la.units] = 1  # a spare fails too
    assert ev.evaluate("checkpoint", c).throughput == 0.0
    assert ev.evaluate("spare", c).batch == pytest.approx(15 / 16)


def test_boost_cap_and_power_limit():
    la = lay()
    c = counts(la, {0: 1, 8: 1, 16: 1})
    none = Evaluator(la, LinearCost(32), PolicyConfig(boost_fraction=0.0))
    assert none.evaluate("ntp-boost", c) == none.evaluate("ntp", c)
    weak = Evaluator(la, LinearCost(32), PolicyConfig(curve=PowerCurve(max_power=1.05)))
    assert weak.boost[30] is None  # +6.7% speed needs more than 1.05x power
    ev = Evaluator(la, LinearCost(32))
    assert 1.0 < ev.boost[30] < 1.1 < ev.boost[28] <= 1.3


def test_larger_payload_costs_every_replica():
    la = lay()
    ev = Evaluator(la, LinearCost(32, sync=1.0))
    c = counts(la, {0: 1})
    out = ev.evaluate("ntp-boost", c)
    assert out.batch == 1.0
    # iteration 8 + 1 healthy, 8 + 32/30 with a TP30 replica syncing 1/30 of a stage
    assert out.throughput == pytest.approx(9 / (8 + 32 / 30))


def test_bad_degree_is_a_config_error():
    with pytest.raises(ConfigError, match="ntp degree 40"):
        Evaluator(lay(), LinearCost(32), PolicyConfig(degrees=(40,)))
    with pytest.raises(ConfigError, match="boost_fraction"):
        PolicyConfig(boost_fraction=1.5)


def test_power_curve_paper_points():
    c = PowerCurve()
    assert c.speed(1.1) == pytest.approx(1.1 * 0.972)
    assert c.speed(1.2) == pytest.approx(1.2 * 0.935)
    assert c.power_for(c.speed(1.15)) == pytest.approx(1.15, abs=1e-6)
    assert c.power_for(2.0) is None
