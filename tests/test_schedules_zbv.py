"""ZB-V (hetpar/schedules/zero_bubble_v.py): V placement, action lists, timing and memory."""

from __future__ import annotations

import pytest

from hetpar.errors import Infeasible
from hetpar.schedules import ChunkTimes, build, execute, in_flight, placement

SHAPES = [(2, 1), (2, 4), (3, 5), (4, 4), (4, 9), (8, 16)]


def test_chunks_sit_in_a_v():
    assert placement("zbv", 4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert placement("interleaved", 4, 2) == (0, 1, 2, 3, 0, 1, 2, 3)
    s = build("zbv", 4, 4, 2)
    for r, acts in enumerate(s.ranks):
        assert {a.chunk for a in acts} == {r, 7 - r}


@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_every_action_once_and_dependencies_hold(pp, m):
    s = build("zbv", pp, m, 2)
    seen = [(a.kind, a.chunk, a.microbatch) for acts in s.ranks for a in acts]
    assert sorted(seen) == sorted((k, c, b) for k in "FBW" for c in range(2 * pp)
                                  for b in range(m))
    # uneven times and a p2p: every action starts after its inputs (plus the send, except at
    # the V's turn, which stays on the last rank) and after its rank's previous action
    n = 2 * pp
    t = execute(s, ChunkTimes(forward=[1.0 + c % 3 for c in range(n)], backward=[2.0] * n,
                              weight=[0.5 + c % 2 for c in range(n)]), p2p=0.25)
    end = {(a.kind, a.chunk, a.microbatch): e for acts in t.ranks for a, _, e in acts}

    def hop(c: int) -> float:  # boundary c -> c + 1
        return 0.0 if c == pp - 1 else 0.25

    for acts in t.ranks:
        prev = 0.0
        for a, start, stop in acts:
            assert start >= prev and stop >= start
            prev = stop
            c, b = a.chunk, a.microbatch
            if a.kind == "F" and c:
                assert start >= end[("F", c - 1, b)] + hop(c - 1)
            if a.kind == "B":
                assert start >= end[("F", c, b)]
                if c < n - 1:
                    assert start >= end[("B", c + 1, b)] + hop(c)
            if a.kind == "W":
                assert start >= end[("B", c, b)]


def test_the_turn_is_local():
    s = build("zbv", 4, 4, 2)
    times = ChunkTimes(forward=[1.0] * 8, backward=[1.0] * 8, weight=[1.0] * 8)
    t = execute(s, times, p2p=lambda a, b: 100.0 if {a, b} == {3, 4} else 0.0)
    assert t.makespan == execute(s, times).makespan


@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_memory_is_one_f_one_b_peak(pp, m):
    # at most pp micro-batches of both half-size chunks: 1F1B's pp whole-stage stashes
    s = build("zbv", pp, m, 2)
    assert max(in_flight(s, "W")) == 2 * min(pp, m)


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 2.0, 1.0)])
def test_fills_more_than_zb_1p_at_its_memory(f, b, w):
    # ZB-V's bubble is below ZB-1p's at the same memory (sail-sg README: bubble rate 0 for
    # ZB-V against (p-1)/3m for ZB-1p when F = B = W), here also when they differ; a rank's
    # whole stage costs f + b + w under both (two half chunks for ZB-V)
    for pp, m in ((4, 8), (8, 16)):
        half = ChunkTimes(forward=[f / 2] * 2 * pp, backward=[b / 2] * 2 * pp,
                          weight=[w / 2] * 2 * pp)
        v = execute(build("zbv", pp, m, 2), half)
        z = execute(build("zb-1p", pp, m, 1), ChunkTimes(forward=[f] * pp, backward=[b] * pp,
                                                         weight=[w] * pp))
        assert v.bubble < z.bubble


def test_refuses_other_chunk_counts():
    with pytest.raises(Infeasible, match="zbv needs vpp = 2 chunks"):
        build("zbv", 4, 4, 3)
    with pytest.raises(Infeasible, match="zbv needs pp >= 2"):
        build("zbv", 1, 4, 2)


def test_simulator_places_the_v():
    from hetpar.catalog import load_cluster, load_model, load_plan
    from hetpar.sim.core import simulate
    from hetpar.sim.explicit import explicit_groups
    from hetpar.sim.network import topology
    from hetpar.specs.expand import expand

    model, cluster = load_model("tiny-llama"), load_cluster("selene-a100")
    plans = {s: load_plan(f"pp=2,vpp=2,dp=1,tp=1,gbs=8,mbs=1,schedule={s}")
             for s in ("zbv", "interleaved")}
    topo = topology(cluster)
    seats = {}
    for name, plan in plans.items():
        chunks = explicit_groups(expand(plan, model, cluster), topo)[0][0]
        seats[name] = [c.devices for c in chunks]
    v, looped = seats["zbv"], seats["interleaved"]
    assert v == [looped[0], looped[1], looped[1], looped[0]] and looped[0] != looped[1]
    assert simulate(model, cluster, plans["zbv"]).iteration_time_s > 0


def test_runtime_refuses_the_v_naming_it():
    from dataclasses import replace

    from hetpar.catalog import load_model, load_plan
    from hetpar.errors import ConfigError
    from hetpar.runtime.layout import build_layout, local_cluster

    model = replace(load_model("tiny-llama"), n_layers=4)
    plan = load_plan("pp=2,vpp=2,gbs=4,mbs=1,schedule=zbv")
    with pytest.raises(ConfigError, match="schedule=zbv places its chunks in a V"):
        build_layout(plan, model, local_cluster(2))
    build_layout(load_plan("pp=2,vpp=2,gbs=4,mbs=1,schedule=interleaved"), model, local_cluster(2))
