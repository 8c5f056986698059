"""Replay on hetpar.sim: the simulator sees the trace's changes through the derived ClusterSpec."""

from __future__ import annotations

import json

import pytest

from hetpar.catalog import load_cluster, load_model
from hetpar.cli.main import main
from hetpar.dynamic.adapters import make_models
from hetpar.dynamic.state import relocate, timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.specs.job import Job

pytest.importorskip("hetpar.sim", reason="hetpar.sim (the simulator) is not available")

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


def test_replay_with_the_simulator_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--model", "llama3.1-70b", "--job", "gbs=512", "--trace",
                 "interzone-fluctuation", "--policy", "all", "--cost", "sim", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    tokens = {r["policy"]: r["tokens"] for r in data["results"]}
    assert tokens["oracle"] >= tokens["adaptive"] >= 0.95 * tokens["oracle"]
