"""The closed-form pipeline agrees with the event-driven executor (uniform and not)."""

import random

import pytest

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError, Infeasible
from hetpar.schedules import ChunkTimes, build, execute, in_flight
from hetpar.sim import simulate
from hetpar.sim.pipeline import RankTimes, check_schedule, in_flight_chunks, makespan
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage


def _exec(schedule, ranks, m, vpp=1):
    pp = len(ranks)
    n = pp * vpp
    per = [ranks[c % pp] for c in range(n)]
    times = ChunkTimes(forward=[r.fwd / vpp for r in per], backward=[r.bwd / vpp for r in per],
                       weight=[r.wgt / vpp for r in per])
    return execute(build(schedule, pp, m, vpp), times).makespan


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_uniform_stages_match_the_executor(schedule):
    ranks = [RankTimes(1.0, 1.2, 0.8)] * 4
    for m in (4, 8, 13):
        assert makespan(schedule, ranks, m, 1) == pytest.approx(_exec(schedule, ranks, m))
    # 1F1B: (m + p - 1)(F + B) (Narayanan et al. 2021)
    assert makespan("1f1b", ranks, 8, 1) == pytest.approx((8 + 3) * 3.0)


def test_interleaved_divides_the_bubble_by_v():
    ranks = [RankTimes(2.0, 4.0, 0.0)] * 4
    m, v = 8, 2
    ideal = m * 6.0
    assert makespan("interleaved", ranks, m, v) - ideal == pytest.approx(3 * 6.0 / v)
    assert makespan("interleaved", ranks, m, v) == pytest.approx(_exec("interleaved", ranks, m, v),
                                                                 rel=0.02)


@pytest.mark.parametrize("schedule,tol", [("1f1b", 0.1), ("gpipe", 1e-9), ("zb-h1", 0.2)])
def test_non_uniform_closed_form_is_close_to_the_executor(schedule, tol):
    rng = random.Random(7)
    for _ in range(50):
        pp = rng.randint(2, 6)
        ranks = [RankTimes(rng.uniform(0.5, 2), rng.uniform(0.5, 2), rng.uniform(0.2, 1))
                 for _ in range(pp)]
        m = rng.randint(pp, 3 * pp)
        closed = makespan(schedule, ranks, m, 1)
        assert closed == pytest.approx(_exec(schedule, ranks, m), rel=tol)
        assert makespan(schedule, ranks, m, 1, exact=True) == _exec(schedule, ranks, m)


def test_simulated_iteration_matches_its_timeline():
    model, cluster = load_model("llama3.1-8b"), load_cluster("selene-a100")
    for text in ("tp=2,pp=4,dp=2,mbs=1,gbs=32", "tp=1,pp=2,dp=4,mbs=2,gbs=64,schedule=gpipe",
                 "tp=2,pp=4,dp=1,mbs=1,gbs=16,schedule=interleaved,vpp=2"):
        rep = simulate(model, cluster, parse_inline_plan(text), timeline=True)
        end = max(e.end for e in rep.timeline)
        assert end == pytest.approx(rep.iteration_time_s, rel=0.01), text


def test_non_uniform_plan_timeline_agrees():
    model, cluster = load_model("llama3.1-8b"), load_cluster("mixed-a100-h100")
    a, h = (g.name for g in cluster.node_groups)
    fast = (Stage(layers=(0, 10), group=a, tp=2), Stage(layers=(10, 24), group=h, tp=2),
            Stage(layers=(24, 32), group=a, tp=2))
    plan = Plan(replicas=(Replica(stages=fast, batch=8, micro_batch=1),))
    rep = simulate(model, cluster, plan, timeline=True)
    assert max(e.end for e in rep.timeline) == pytest.approx(rep.iteration_time_s, rel=1e-6)


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("zb-1p", 1),
                                          ("zb-2p", 1),
                                          ("interleaved", 2), ("interleaved", 3)])
def test_in_flight_closed_forms_match_the_action_lists(schedule, vpp):
    for pp, m in ((4, 8), (4, 12), (2, 6)):
        # held until the last backward action: W for schedules that split it (Qi et al.)
        counted = in_flight(build(schedule, pp, m, vpp), until="W")
        for r in range(pp):
            assert in_flight_chunks(schedule, pp, m, vpp, r) == counted[r]


def test_schedule_checks():
    with pytest.raises(ConfigError, match="unknown"):
        check_schedule("nope", 2, 1, 4)
    with pytest.raises(Infeasible):
        check_schedule("1f1b", 2, 2, 4)
    with pytest.raises(Infeasible):
        check_schedule("interleaved", 4, 2, 6)


def test_zero_bubble_memory_limited_schedules():
    # Qi et al. 2024 Table 2: ZB-1p reaches ZB-H1's bubble (p - 1)(F + B - W) at 1F1B's memory;
    # ZB-2p with twice the memory (p - 1)(F + B - 2W), iterations overlapping (Sec. 4)
    ranks = [RankTimes(1.0, 1.2, 0.8)] * 4
    m = 12
    assert makespan("zb-1p", ranks, m, 1) == pytest.approx(makespan("zb-h1", ranks, m, 1))
    assert makespan("zb-2p", ranks, m, 1) == pytest.approx(m * 3.0 + 3 * (1.0 + 1.2 - 1.6))
    # one iteration alone (the executor) cannot overlap the next: an upper bound
    assert _exec("zb-2p", ranks, m) >= makespan("zb-2p", ranks, m, 1)
    # ZB-2p holds up to twice 1F1B's peak stash on every rank, ZB-1p up to 1F1B's
    for name, limit in (("zb-1p", 4), ("zb-2p", 8)):
        assert max(in_flight_chunks(name, 4, m, 1, r) for r in range(4)) == limit
