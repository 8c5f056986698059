"""The NTP paper's setting at 0.4% failed GPUs, with the simulator as the replica cost."""

from __future__ import annotations

import pytest

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.failures.analysis import PAPER_PLAN, make_setup
from hetpar.failures.policies import PolicyConfig
from hetpar.failures.sweep import sweep


@pytest.fixture(scope="module")
def setup():
    return make_setup(load_model("ntp-480b"), load_cluster("b200-nvl32-32k"),
                      load_plan(PAPER_PLAN), config=PolicyConfig(), cost="sim")


def test_layout_is_the_papers(setup):
    lay = setup.lay
    assert (lay.domain_size, lay.tp, lay.units_per_replica, lay.replicas) == (32, 32, 8, 128)
    assert lay.domains_per_replica == 8 and lay.batch_per_replica * 16384 * 128 == 2**24


def test_losses_at_four_per_mille_match_the_paper(setup):
    # Arfeen et al. 2025, Fig. 6: DP-DROP ~12%, NTP <= 3%, NTP-PW < 1% at 0.4% failed GPUs
    r = sweep(setup.ev, (0.004,), samples=40, seed=0,
              policies=("drop-packed", "ntp", "ntp-boost"), pool_units=setup.pool_units)
    assert r.loss["drop-packed"][0] == pytest.approx(0.12, abs=0.015)
    assert r.loss["ntp"][0] <= 0.03
    assert r.loss["ntp-boost"][0] < 0.01
    assert r.batch["ntp-boost"][0] == 1.0


def test_degraded_replicas_keep_pace_at_lower_share(setup):
    ev = setup.ev
    # TP30 keeps 7 of 8 sequences (30/32 > 7/8). TP28 sits exactly on the line: compute
    # scales by 28/32 = 7/8, so 7 fits only when the iteration's other terms shrink enough.
    assert ev.bmax[30] == 7 and ev.bmax[28] in (6, 7)
    assert ev.bmax[28] <= ev.bmax[30]
    # boosting within the paper's +30%: TP30 needs about the 1.1x of its Table 1
    assert 1.05 < ev.boost[30] < 1.15 and ev.boost[28] <= 1.3


def test_interleaved_schedule_cannot_shrink_the_share():
    # Megatron's interleaved schedule needs micro-batches % pp == 0: 7 or 6 of 8 cannot run,
    # so NTP can only keep a degraded replica by boosting it
    plan = load_plan("tp=32,pp=8,dp=128,mbs=1,gbs=1024,sp=true,vpp=4,schedule=interleaved")
    s = make_setup(load_model("ntp-480b"), load_cluster("b200-nvl32-32k"), plan,
                   config=PolicyConfig(), cost="sim")
    assert s.ev.bmax[30] == 0 and s.ev.bmax[28] == 0
    assert s.ev.boost[30] is not None


def test_mixed_degrees_cost_a_larger_all_reduce_and_reshards(setup):
    sync = setup.ev.cost.sync_time
    healthy, tp30, tp28 = (sync(frozenset(d), 128) for d in ({32}, {32, 30}, {32, 28}))
    assert healthy < tp30 < tp28
    # every replica at TP30: the larger payload but nothing to reshard
    assert healthy < sync(frozenset({30}), 128) < tp30
