"""The expert-parallel failure study on explicit replicas (one A100 and one H100 replica in
one EP group): each distinct replica fails in turn, the experts are re-placed by the plan's
split rule or the EP group is dropped, priced by `simulate`; docs/failures.md's examples."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli.main import main
from hetpar.failures import experts
from hetpar.sim import simulate
from hetpar.specs.plan import Plan

DOCS = Path(__file__).resolve().parents[1] / "docs"
MIXTRAL = load_model("mixtral-8x7b")
MIXED = load_cluster("mixed-a100-h100")


def _pair_toml() -> str:
    """docs/simulator.md's mixtral-a100-h100.toml (one A100 and one H100 replica)."""
    text = (DOCS / "simulator.md").read_text(encoding="utf-8")
    at = text.index('name = "mixtral-a100-h100"')
    block = text[text.rfind("```toml", 0, at):text.index("```", at)]
    return "\n".join(line[2:] for line in block.splitlines()[1:]) + "\n"


def _files(tmp_path: Path) -> dict[str, Path]:
    """The two plan files docs/failures.md runs: the pair, and its replicas written twice."""
    pair = _pair_toml()
    head, *tables = pair.split("[[replicas]]")
    files = {"mixtral-a100-h100.toml": pair,
             "mixtral-a100-h100-x2.toml": head + "[[replicas]]".join(["", *tables, *tables])}
    out = {}
    for name, body in files.items():
        out[name] = tmp_path / name
        out[name].write_text(body, encoding="utf-8")
    return out


def _rate(plan: Plan) -> float:
    return plan.batch / simulate(MIXTRAL, MIXED, plan).iteration_time_s


def test_split_at_re_derives_counts() -> None:
    plan = Plan(dp=4, global_batch=8, axes=(("ep", 4),), experts_per_rank=(1, 3, 1, 3))
    # new coordinate j holds old coordinates j and j + 2
    assert experts.split_at(plan, 2) == (2, 6) and experts.split_at(plan, 4) == (1, 3, 1, 3)
    assert experts.split_at(plan, 1) == "even"
    same = Plan(dp=4, global_batch=8, axes=(("ep", 4),), experts_per_rank=(1, 1, 3, 3))
    assert experts.split_at(same, 2) == "even"  # 4/4
    speed = Plan(dp=4, global_batch=8, axes=(("ep", 4),), experts_per_rank="by_speed")
    assert experts.split_at(speed, 2) == "by_speed" and experts.split_at(speed, 1) == "even"


def test_each_replica_fails_and_the_survivor_is_priced_by_simulate(tmp_path: Path) -> None:
    plan = load_plan(str(_files(tmp_path)["mixtral-a100-h100.toml"]))
    assert experts.failed_replicas(plan) == (0, 1)
    healthy = _rate(plan)
    for failed, kept in ((0, 1), (1, 0)):
        r = experts.study(MIXTRAL, MIXED, plan, failed)
        re_place, drop = r.options
        assert re_place.plan is not None and re_place.plan.replicas == (plan.replicas[kept],)
        assert re_place.plan.degree("ep") == 1 and re_place.plan.experts_per_rank == "even"
        assert re_place.throughput == pytest.approx(_rate(re_place.plan) / healthy)
        assert drop.plan is None and "span all 2 replicas" in drop.reason
    # the A100 paced the pair: losing it keeps nearly all the throughput, losing the H100 not
    a100, h100 = (experts.study(MIXTRAL, MIXED, plan, i).chosen.throughput for i in (0, 1))
    assert a100 > 0.9 > 0.5 > h100 > 0


def test_dropping_an_ep_group_keeps_by_speed(tmp_path: Path) -> None:
    plan = load_plan(str(_files(tmp_path)["mixtral-a100-h100-x2.toml"]))
    assert experts.failed_replicas(plan) == (0, 1)  # replicas 2 and 3 repeat 0 and 1
    r = experts.study(MIXTRAL, MIXED, plan, 0)
    re_place, drop = r.options
    assert drop.plan is not None and drop.plan.replicas == plan.replicas[2:]
    assert drop.plan.experts_per_rank == "by_speed" and drop.split == (1, 7)
    assert drop.throughput == pytest.approx(_rate(drop.plan) / _rate(plan))
    # three replicas left: no ep > 1 divides them, so each GPU holds all 8 experts
    assert re_place.plan is not None and len(re_place.plan.replicas) == 3
    assert re_place.plan.degree("ep") == 1 and r.chosen is re_place


def test_counts_are_re_derived_when_ep_shrinks() -> None:
    pod = load_cluster("h100-pod-400g")
    plan = load_plan("tp=2,pp=8,dp=4,ep=4,mbs=1,gbs=128,sp=true,recompute=full")
    plan = replace(plan, experts_per_rank=(1, 3, 1, 3))
    r = experts.study(MIXTRAL, pod, plan)
    re_place = r.options[0]
    # 3 replicas x tp 2 = 6 ranks: ep 4 -> 2, coordinates 0+2 and 1+3 merged
    assert re_place.plan is not None and re_place.plan.degree("ep") == 2
    assert re_place.plan.experts_per_rank == (2, 6) and re_place.split == (2, 6)
    assert re_place.throughput == pytest.approx(
        re_place.plan.batch / simulate(MIXTRAL, pod, re_place.plan).iteration_time_s
        / (plan.batch / r.iteration_s))


def _doc_blocks() -> list[tuple[str, list[str]]]:
    text = (DOCS / "failures.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```\n(\$ hetpar failures [^\n]*mixtral-a100-h100[^\n]*)\n(.*?)```",
                        text, flags=re.S)
    return [(command, shown.splitlines()) for command, shown in blocks]


def test_the_docs_examples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _files(tmp_path)
    blocks = _doc_blocks()
    assert len(blocks) == 2
    for command, shown in blocks:
        argv = command.split()[2:]  # after "$ hetpar"
        name = argv[argv.index("--plan") + 1]
        argv[argv.index(name)] = str(files[name])
        assert main(argv) == 0
        assert capsys.readouterr().out.splitlines() == shown


def test_cli_json_and_write_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = _files(tmp_path)["mixtral-a100-h100.toml"]
    args = ["failures", "--model", "mixtral-8x7b", "--cluster", "mixed-a100-h100",
            "--plan", str(plan_file)]
    out = tmp_path / "degraded.toml"
    assert main([*args, "--json", "--write-plan", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["failed_replica"] for s in data["experts"]] == [0, 1]
    assert data["written_plan"]["failed_replica"] == 0  # the first study's chosen plan
    written = load_plan(str(out))
    # the A100 replica lost: the H100 replica alone, every expert on each GPU
    assert [s.group for s in written.replicas[0].stages] == ["h100"] * 16
    assert len(written.replicas) == 1 and written.degree("ep") == 1
    assert simulate(MIXTRAL, MIXED, written).iteration_time_s == pytest.approx(
        data["experts"][0]["options"][0]["iteration_s"])
