"""`hetpar simulate`'s collectives table on an EP plan whose EP group is a DP group's ranks:
each communicator once, under the axis that issues its collective (before, the all-to-all was
shown under dp and dp's all-reduce under ep, as both shared one recording object)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli.main import main
from hetpar.sim import simulate

MIXTRAL = load_model("mixtral-8x7b")
POD = load_cluster("h100-pod-400g")
# tp = 1: ep = 8 is carved from dp = 8 alone, so every EP group is a DP group's ranks
SAME = "tp=1,pp=8,dp=8,ep=8,mbs=1,gbs=256,recompute=full"


def _rows(plan_text: str) -> list[tuple[str, str]]:
    r = simulate(MIXTRAL, POD, load_plan(plan_text), collectives=True)
    return [(c.axis, c.collective) for c in r.collectives]


def test_the_all_to_all_is_shown_under_ep_only() -> None:
    rows = _rows(SAME)
    assert len(rows) == len(set(rows))
    assert [op for axis, op in rows if axis == "ep"] == ["all_to_all"]
    assert "all_to_all" not in [op for axis, op in rows if axis != "ep"]
    assert ("dp", "all_reduce") in rows


def test_explicit_replicas_in_one_ep_group(tmp_path: Path) -> None:
    stages = ", ".join(f'{{layers = [{4 * i}, {4 * i + 4}], group = "h100", tp = 1}}'
                       for i in range(8))
    replica = f"[[replicas]]\nbatch = 16\nmicro_batch = 1\nstages = [{stages}]\n"
    path = tmp_path / "pair.toml"
    path.write_text('ep = 2\nrecompute = "full"\nzero = 1\n' + replica * 2, encoding="utf-8")
    r = simulate(MIXTRAL, POD, load_plan(str(path)), collectives=True)
    rows = [(c.axis, c.collective) for c in r.collectives]
    assert [op for axis, op in rows if axis == "ep"] == ["all_to_all"]
    assert "all_to_all" not in [op for axis, op in rows if axis != "ep"]


def test_the_cli_prints_each_communicator_once(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "mixtral-8x7b", "--cluster", "h100-pod-400g", "--plan", SAME]
    assert main(args) == 0
    table = capsys.readouterr().out.split("\ncollectives ")[1].splitlines()[1:]
    shown = [line.split()[:2] for line in table if line.startswith("  ")]
    assert ["ep", "all_to_all"] in shown and ["dp", "all_to_all"] not in shown
    assert ["ep", "all_reduce"] not in shown
