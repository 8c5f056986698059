"""Incremental re-planning (dynamic/incremental.py): re-price the last search's plans while the
GPU set holds, search again when it changes or none of them runs."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.catalog import load_cluster
from hetpar.dynamic.incremental import Ranking, present, replan
from hetpar.dynamic.state import ClusterState, relocate, timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

ROWS = ("100,factor,tier:switch,0.2,,\n200,slowdown,group:rtx4090,2,1,\n"
        "300,leave,group:rtx3090,,,1\n")


def _states() -> list[ClusterState]:
    text = f"# horizon_s: 1000\nt_s,kind,target,value,node,nodes\n{ROWS}"
    return [s.state for s in timeline(load_cluster("consumer-mix"), parse_csv(text, "t.csv"))]


def _plan(name: str, group: str, devices: tuple[int, ...]) -> Plan:
    reps = tuple(Replica(stages=(Stage(layers=(0, 24), group=group, tp=1, devices=(d,)),),
                         batch=4, micro_batch=4) for d in devices)
    return Plan(name=name, replicas=reps, micro_batch=4)


class _Cost:
    """Tokens/s from a table per (plan name, state time): the ranking flips at t=100."""

    def __init__(self, table: dict[tuple[str, float], float]) -> None:
        self.table = table

    def __call__(self, plans: Sequence[Plan], state: ClusterState) -> Plan | None:
        scored = [(self.table.get((p.name, state.t_s), 0.0), -i) for i, p in enumerate(plans)]
        tps, i = max(scored)
        return plans[-i] if tps > 0 else None


def test_same_gpus_reprice_the_ranking_and_pick_its_best_on_the_new_state() -> None:
    s0, s1, s2, s3 = _states()
    a = _plan("a", "rtx3090", (0, 1, 2, 3))
    b = _plan("b", "rtx4090", (0, 4, 8, 12))  # node 1 of rtx4090 (devices 4-7) slows at t=200
    searches: list[float] = []

    def full(state: ClusterState) -> Ranking:
        searches.append(state.t_s)
        return Ranking(state=state, plans=(a, b) if state.t_s == 0 else (b,))

    cost = _Cost({("a", 100.0): 1.0, ("b", 100.0): 2.0, ("a", 200.0): 3.0, ("b", 200.0): 2.5})
    d0, last = replan(s0, None, cost, full)
    assert d0.full and d0.plan == a and searches == [0.0]
    d1, last = replan(s1, last, cost, full)
    assert not d1.full and d1.priced == 2 and d1.plan is not None and d1.plan.name == "b"
    # the straggler node becomes its own group: b's stage there moves to its derived name
    d2, last = replan(s2, last, cost, full)
    assert not d2.full and d2.plan is not None and d2.plan.name == "a"
    groups = [st.group for r in relocate(b, s0, s2).replicas for st in r.stages]
    assert groups == ["rtx4090", "rtx4090@1", "rtx4090@2", "rtx4090@2"]
    assert searches == [0.0] and last is not None and last.state is s0
    # a node left: the GPU set changed, so the ranking is searched again
    assert present(s3) != present(s0)
    d3, last = replan(s3, last, cost, full)
    assert d3.full and d3.plan == b and searches == [0.0, 300.0]


def test_a_ranking_of_which_nothing_runs_searches_again() -> None:
    s0, s1 = _states()[:2]
    a = _plan("a", "rtx3090", (0, 1))
    calls: list[float] = []

    def full(state: ClusterState) -> Ranking | None:
        calls.append(state.t_s)
        return Ranking(state=state, plans=(a,)) if state.t_s == 0 else None

    d, last = replan(s1, Ranking(state=s0, plans=(a,)), _Cost({}), full)
    assert d.full and d.plan is None and last is None and calls == [100.0]

