"""`hetpar run` end to end: a real run, a 128-rank dry run, lazy torch import, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from loadscale import deadline

from hetpar.cli.main import main

pytestmark = pytest.mark.timeout(deadline(120))


def test_run_prints_falling_losses_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--model", "tiny-llama", "--plan", "tp=2,pp=2,gbs=4,sp=true",
               "--steps", "3", "--lr", "1e-2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 4
    assert len(out["losses"]) == 3 and out["losses"][-1] < out["losses"][0]


def test_dry_run_of_128_ranks_builds_groups_and_checks_memory(
        capsys: pytest.CaptureFixture[str]) -> None:
    plan = "tp=8,pp=4,dp=4,gbs=256,recompute=full,zero=1"
    rc = main(["run", "--model", "llama3.1-70b", "--cluster", "h100-pod-400g", "--plan", plan,
               "--dry-run", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["world_size"] == 128 and not d["oom"]
    # 4 x 8 sharded DP groups (one per stage and TP shard) + 4 groups for replicated weights.
    assert d["groups"] == {"tp": 16, "dp": 36, "ntp": 0}
    ranks = sorted(r for rep in d["replicas"] for s in rep["stages"] for r in s["ranks"])
    assert ranks == list(range(128))


def test_dry_run_reports_out_of_memory_as_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--model", "llama3.1-70b", "--cluster", "h100-pod-400g",
               "--plan", "tp=8,pp=4,dp=4,gbs=256", "--dry-run"])
    assert rc == 2
    assert "memory" in capsys.readouterr().err


def test_indivisible_tp_is_infeasible(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--model", "tiny-llama", "--plan", "tp=3,gbs=4", "--dry-run"])
    assert rc == 2
    assert "n_heads" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["tpu", "cuda"])
def test_unusable_device_is_a_config_error(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if device == "cuda" and torch.cuda.device_count() > 0:
        pytest.skip("a CUDA device is present")
    assert main(["run", "--model", "tiny-gpt", "--plan", "gbs=2", "--device", device]) == 2
    assert "--device" in capsys.readouterr().err


def test_importing_the_cli_does_not_import_torch() -> None:
    code = "import sys, hetpar.cli.main as m; m.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_dry_run_of_an_ntp_plan_counts_resharding_groups() -> None:
    from hetpar.catalog import load_model
    from hetpar.runtime.dryrun import dry_run
    from hetpar.specs.plan import Plan
    from hetpar.specs.stage import Replica, Stage

    def rep(tp: int, batch: int) -> Replica:
        return Replica(stages=(Stage(layers=(0, 2), group="local", tp=tp),), batch=batch,
                       micro_batch=1)

    d = dry_run(load_model("tiny-llama"), Plan(replicas=(rep(2, 3), rep(1, 1))))
    # TP group {0, 1}; weight pieces {0, 2} and {1, 2}; replicated weights over {0, 1, 2}.
    assert d.groups == {"tp": 1, "dp": 1, "ntp": 2}
    assert d.world_size == 3 and [r["batch"] for r in d.replicas] == [3, 1]


def test_torchrun_launch_matches_the_forked_run(capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import shutil

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    args = ["run", "--model", "tiny-gpt", "--plan", "tp=2,gbs=4", "--steps", "2",
            "--dtype", "float64", "--json"]
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m",
                          "hetpar.cli.main", *args], capture_output=True, text=True,
                         timeout=deadline(100))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "{" in out.stdout, (out.stdout[-2000:], out.stderr[-2000:])
    via_torchrun = json.loads(out.stdout[out.stdout.index("{"):])["losses"]
    assert main(args) == 0
    forked = json.loads(capsys.readouterr().out)["losses"]
    assert via_torchrun == pytest.approx(forked, rel=1e-12)
