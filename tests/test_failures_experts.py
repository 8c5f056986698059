"""A failed GPU in an expert-parallel plan: experts re-placed over the surviving replicas or the
EP group dropped, both priced by the simulator; `hetpar failures` names the policy chosen."""

from __future__ import annotations

import json

import pytest

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.failures import experts
from hetpar.sim import simulate

MIXTRAL = load_model("mixtral-8x7b")
POD = load_cluster("h100-pod-400g")
# pp = 8 leaves room for 4 experts per GPU; pp = 4 does not (the dense case of ep=2 below)
ROOMY = "tp=2,pp=8,dp=8,ep=8,mbs=1,gbs=256,sp=true,recompute=full"
TIGHT = "tp=2,pp=4,dp=8,ep=8,mbs=1,gbs=256,sp=true,recompute=full"


def _rate(text: str) -> float:
    plan = load_plan(text)
    return plan.batch / simulate(MIXTRAL, POD, plan).iteration_time_s


def test_re_placing_the_experts_beats_dropping_the_ep_group() -> None:
    r = experts.study(MIXTRAL, POD, load_plan(ROOMY))
    re, drop = r.options
    assert re.policy == "re-place experts" and r.chosen is re
    # 7 replicas survive, 14 ranks to carve EP from (etp = 1): ep 8 -> 2, 4 experts per GPU
    assert re.plan is not None and (re.plan.dp, re.plan.degree("ep")) == (7, 2)
    # ep stays 8: whole EP groups of 8 ranks = 4 replicas
    assert drop.plan is not None and (drop.plan.dp, drop.plan.degree("ep")) == (4, 8)
    healthy = _rate(ROOMY)
    assert re.throughput == pytest.approx(
        _rate(ROOMY.replace("dp=8,ep=8", "dp=7,ep=2").replace("gbs=256", "gbs=224")) / healthy)
    assert drop.throughput == pytest.approx(
        _rate(ROOMY.replace("dp=8", "dp=4").replace("gbs=256", "gbs=128")) / healthy)
    assert re.throughput > drop.throughput > 0
    # more experts per GPU: the re-placed plan's fullest GPU holds more than the healthy one's
    mem = [max(m.total for m in simulate(MIXTRAL, POD, p).memory)
           for p in (load_plan(ROOMY), re.plan)]
    assert mem[1] > mem[0]


def test_memory_forbids_re_placing_the_experts() -> None:
    r = experts.study(MIXTRAL, POD, load_plan(TIGHT))
    re, drop = r.options
    assert re.plan is not None and re.plan.degree("ep") == 2 and re.throughput == 0.0
    assert "GiB >" in re.reason  # feasibility.memory's verdict on the fullest rank
    assert r.chosen is drop and drop.throughput > 0


def test_an_ep_group_over_every_replica_cannot_be_dropped() -> None:
    plan = load_plan("tp=1,pp=8,dp=8,ep=8,mbs=1,gbs=256,recompute=full")
    assert experts.drop_group(plan) == "one EP group (ep=8) spans all 8 replicas"
    with pytest.raises(ConfigError, match="needs ep > 1; got ep=1"):
        experts.study(MIXTRAL, POD, load_plan("tp=2,pp=8,dp=8,mbs=1,gbs=256"))


def test_cli_names_the_policy_chosen(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    args = ["failures", "--model", "mixtral-8x7b", "--cluster", "h100-pod-400g"]
    assert main([*args, "--plan", ROOMY]) == 0
    out = capsys.readouterr().out
    assert "re-place experts: dp=7, ep=2 (experts per GPU: 4)" in out
    assert "chosen: re-place experts" in out
    assert main([*args, "--plan", TIGHT, "--json"]) == 0
    [data] = json.loads(capsys.readouterr().out)["experts"]  # a uniform plan: one study
    assert data["failed_replica"] is None
    assert data["chosen"] == "drop EP group" and data["options"][0]["throughput"] == 0.0
    path = tmp_path / "ep.toml"
    assert main([*args, "--plan", ROOMY, "--write-plan", str(path)]) == 0
    written = load_plan(str(path))
    assert (written.dp, written.degree("ep"), written.batch) == (7, 2, 224)
