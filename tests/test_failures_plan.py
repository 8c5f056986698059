"""NTP plans are real plans: written, loaded, expanded and simulated like any other."""

from __future__ import annotations

import numpy as np
import pytest

from hetpar.catalog import load_plan, parse_inline_plan
from hetpar.errors import ConfigError, Infeasible
from hetpar.failures.analysis import make_setup
from hetpar.failures.layout import layout
from hetpar.failures.ntp_plan import degraded_plan, write_plan
from hetpar.failures.policies import PolicyConfig
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.expand import expand
from hetpar.specs.model import ModelSpec

# 24 heads split over TP8 and over the degraded TP6 alike, so the simulator can run both
MODEL = ModelSpec(name="t24", n_layers=8, hidden=1536, n_heads=24, n_kv_heads=24,
                  ffn_hidden=6144, vocab=1024, seq_len=2048)
CLUSTER = ClusterSpec(name="t128", node_groups=(
    NodeGroup(name="g", gpu="H100-SXM5-80GB", num_nodes=16, gpus_per_node=8),))
PLAN = parse_inline_plan("tp=8,pp=2,dp=8,mbs=1,gbs=32,sp=true,schedule=zb-h1")


@pytest.fixture(scope="module")
def setup():
    return make_setup(MODEL, CLUSTER, PLAN, config=PolicyConfig(), cost="sim")


def _failed(gpus, idx):
    f = np.zeros(gpus, dtype=bool)
    f[list(idx)] = True
    return f


@pytest.mark.parametrize("policy", ["ntp", "ntp-boost", "drop-packed"])
def test_degraded_plan_round_trip_and_simulate(setup, tmp_path, policy):
    failed = _failed(128, [3, 17, 100])  # units 0, 2 and 12 lose one GPU each
    plan = degraded_plan(MODEL, PLAN, setup.ev, failed, policy)
    path = tmp_path / f"{policy}.toml"
    write_plan(plan, path)
    loaded = load_plan(str(path))
    assert loaded == plan
    used = {d for r in expand(loaded, MODEL, CLUSTER).replicas for s in r.stages
            for d in s.devices or ()}
    assert not used & {3, 17, 100}
    assert loaded.batch == sum(r.batch for r in loaded.replicas)
    tps = sorted({s.tp for r in loaded.replicas for s in r.stages})
    assert tps == ([8] if policy == "drop-packed" else [6, 8])
    report = simulate(MODEL, CLUSTER, loaded)
    healthy = simulate(MODEL, CLUSTER, PLAN)
    assert report.iteration_time_s >= healthy.iteration_time_s * 0.99
    if policy == "ntp":
        # three degraded units packed into two replicas of two stages at TP6, smaller shares
        deg = [r for r in loaded.replicas if r.stages[0].tp == 6]
        assert len(deg) == 2 and all(r.batch == setup.ev.bmax[6] for r in deg)
        assert loaded.batch == 32 - 2 * (4 - setup.ev.bmax[6])
    if policy == "ntp-boost":
        # 8 -> 6 GPUs needs +33% speed, beyond +30% power: no unit can be boosted
        assert setup.ev.boost[6] is None
        assert loaded.batch == degraded_plan(MODEL, PLAN, setup.ev, failed, "ntp").batch


def test_ntp_share_keeps_pace_in_the_simulator(setup):
    ev = setup.ev
    assert 1 <= ev.bmax[6] < 4
    assert ev.cost.replica_time(6, ev.bmax[6]) <= ev.pace
    assert ev.cost.replica_time(6, ev.bmax[6] + 1) > ev.pace


def test_json_plan_is_written_atomically(setup, tmp_path):
    plan = degraded_plan(MODEL, PLAN, setup.ev, _failed(128, [0]), "ntp")
    write_plan(plan, tmp_path / "p.json")
    assert load_plan(str(tmp_path / "p.json")) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_plan_that_does_not_match_the_cluster():
    with pytest.raises(ConfigError, match="tp\\*cp\\*dp\\*pp = 256 GPUs.*has 128"):
        layout(MODEL, CLUSTER, parse_inline_plan("tp=8,pp=2,dp=16,gbs=32"))
    with pytest.raises(ConfigError, match="tp=12 does not fit the 8-GPU scale-up domain"):
        layout(MODEL, CLUSTER, parse_inline_plan("tp=12,pp=1,dp=8,gbs=32"))
    # simulate's verdict first (feasibility.check_costed): 24 heads do not split over 16
    with pytest.raises(Infeasible, match="n_heads \\(24\\) not divisible by tp \\(16\\)"):
        layout(MODEL, CLUSTER, parse_inline_plan("tp=16,pp=1,dp=8,gbs=32"))
