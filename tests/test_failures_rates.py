"""Failure-rate presets (published figures), their validation and the repair distributions."""

from __future__ import annotations

import numpy as np
import pytest

from hetpar.errors import ConfigError
from hetpar.failures.rates import FailureClass, FailureRates, Repair, load_rates, preset_names


def test_presets_load_and_cite():
    assert {"llama3", "llama3-3day", "meta-rsc1", "meta-rsc2"} <= set(preset_names())
    for name in preset_names():
        r = load_rates(name)
        assert r.sources and 0 < r.per_gpu_day < 0.01


def test_llama3_rates_are_the_published_counts():
    r = load_rates("llama3")
    # Dubey et al. 2024: 419 interruptions, 54 days, 16,384 GPUs, 78% hardware
    assert r.per_gpu_day == pytest.approx(419 / (54 * 16384))
    hw = next(c for c in r.classes if c.name == "hardware")
    assert r.class_rate(hw) * 86400 * 54 * 16384 == pytest.approx(0.78 * 419)
    # Little's law: 32,768 GPUs keep ~59 GPUs down with 5-day hardware, 3-hour software repair
    assert r.mean_failed_fraction() * 32768 == pytest.approx(
        419 / 54 / 16384 * 32768 * (0.78 * 5 + 0.22 * 3 / 24))


def test_meta_rsc_rates_per_node_day():
    assert load_rates("meta-rsc1").per_gpu_day == pytest.approx(6.50 / 1000 / 8)
    assert load_rates("meta-rsc2").per_gpu_day == pytest.approx(2.34 / 1000 / 8)


def _rates(**kw):
    base = dict(name="x", events=10.0, gpus=100, days=1.0,
                classes=(FailureClass(name="hw", share=1.0, repair=Repair(mean_hours=1.0)),))
    return FailureRates(**(base | kw))


def test_rate_above_one_per_gpu_day_is_rejected():
    with pytest.raises(ConfigError, match="failures per GPU-day.*allowed: 0..1"):
        _rates(events=1000.0, gpus=10)


def test_bad_shares_are_rejected():
    with pytest.raises(ConfigError, match="share 1.5 not allowed"):
        FailureClass(name="hw", share=1.5, repair=Repair(mean_hours=1.0))
    two = tuple(FailureClass(name=n, share=0.6, repair=Repair(mean_hours=1.0)) for n in "ab")
    with pytest.raises(ConfigError, match="shares sum to 1.200"):
        _rates(classes=two)


def test_unknown_preset_lists_known(tmp_path):
    with pytest.raises(ConfigError, match="known: .*llama3"):
        load_rates("nope")
    bad = tmp_path / "r.toml"
    bad.write_text('name = "r"\nevents = 1.0\ngpus = 1\ndays = 1.0\nclasses = []\nfoo = 1\n')
    with pytest.raises(ConfigError, match="unknown key 'foo'"):
        load_rates(str(bad))


@pytest.mark.parametrize("kind", ["fixed", "exponential", "lognormal"])
def test_repair_samples_have_the_stated_mean(kind):
    r = Repair(kind=kind, mean_hours=5.0, sigma=0.8)
    x = r.sample(np.random.default_rng(0), 200_000)
    assert x.mean() == pytest.approx(5 * 3600, rel=0.01)
    assert (x > 0).all()
