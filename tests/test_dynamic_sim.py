"""Replay on hetpar.sim: the simulator sees the trace's changes through the derived ClusterSpec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpar.catalog import load_cluster, load_model
from hetpar.cli.main import main
from hetpar.dynamic.adapters import make_models
from hetpar.dynamic.state import relocate, timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.specs.job import Job

MODEL = load_model("llama3.1-70b")
JOB = Job(global_batch=512)


def _states(rows: str) -> list:
    text = f"# horizon_s: 9000\nt_s,kind,target,value,node,nodes\n{rows}"
    return [s.state for s in timeline(load_cluster("two-zone-a100"), parse_csv(text, "t.csv"))]


def test_the_simulator_sees_link_changes_and_stragglers() -> None:
    s0, s_slow_link, s_straggler = _states("100,factor,link:zone-a/zone-b,0.05,,\n"
                                           "200,factor,link:zone-a/zone-b,1,,\n"
                                           "200,slowdown,group:zone-a,3,4,\n")
    cost, planner = make_models("sim", MODEL, JOB)
    analytic, _ = make_models("analytic", MODEL, JOB)
    plan = planner.best(s0)
    assert plan is not None and {r.stages[0].group for r in plan.replicas} == {"zone-a", "zone-b"}
    base = cost.tokens_per_s(plan, s0)
    assert base > 0
    # the two models describe the same hardware: same order of magnitude
    assert 0.5 < analytic.tokens_per_s(plan, s0) / base < 2.0
    assert cost.tokens_per_s(relocate(plan, s0, s_slow_link), s_slow_link) < base
    assert cost.tokens_per_s(relocate(plan, s0, s_straggler), s_straggler) < base


def test_replay_with_the_simulator_from_the_cli(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("# horizon_s: 20000\n# cluster: two-zone-a100\n"
                     "t_s,kind,target,value,node,nodes\n"
                     "3000,factor,link:zone-a/zone-b,0.05,,\n9000,factor,link:zone-a/zone-b,1,,\n")
    code = main(["replay", "--model", "llama3.1-70b", "--job", "gbs=512", "--trace", str(trace),
                 "--policy", "all", "--cost", "sim", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    tokens = {r["policy"]: r["tokens"] for r in data["results"]}
    assert tokens["oracle"] >= tokens["adaptive"] >= 0.95 * tokens["oracle"]
    assert tokens["adaptive"] > tokens["static"]


def test_the_search_planner_adapter_plans_each_state() -> None:
    from hetpar.dynamic.adapters import SearchPlanner
    from hetpar.dynamic.replay import Replayer

    model, job = load_model("llama3.1-8b"), Job(global_batch=256)
    text = ("# horizon_s: 7200\nt_s,kind,target,value,node,nodes\n"
            "1000,leave,group:a100,,,8\n4000,join,group:a100,,,8\n")
    cost, _ = make_models("sim", model, job)
    planner = SearchPlanner(model, job)
    rp = Replayer(model, job, load_cluster("mixed-a100-h100"), parse_csv(text, "t.csv"), cost,
                  planner)
    for step in rp.steps:
        plan = planner.best(step.state)
        assert plan is not None and all(s.devices for r in plan.replicas for s in r.stages)
        assert cost.tokens_per_s(plan, step.state) > 0
    static, oracle = rp.run("static"), rp.run("oracle")
    assert static.switches[0].forced and oracle.tokens >= static.tokens
