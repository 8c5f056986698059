"""The planner on a real Ray cluster: two local Ray nodes started by the test (the ``ray``
extra; the session fixture ``ray_two_nodes`` of conftest.py), the same ranked plans as the
process pool, and ``--workers ray`` from the CLI."""

from __future__ import annotations

import pytest

from hetpar.catalog import load_cluster, load_job, load_model
from hetpar.cli.main import main
from hetpar.search import load_space, search

ray = pytest.importorskip("ray", reason="ray extra not installed: pip install -e .[ray]")

MODEL, CLUSTER = load_model("llama3.1-8b"), load_cluster("v100-a100")


def _ranked(**kw):
    job = load_job("default")
    return search(MODEL, CLUSTER, job, load_space("default"), top=5, **kw)


def test_search_across_two_nodes_equals_the_process_pool(ray_two_nodes) -> None:
    via_ray = _ranked(ray_address=ray_two_nodes.address)
    pool = _ranked(workers=2)
    assert via_ray.stats.simulated == pool.stats.simulated > 0
    assert [r.key for r in via_ray.ranked] == [r.key for r in pool.ranked]
    assert [r.score for r in via_ray.ranked] == [r.score for r in pool.ranked]


def test_cli_workers_ray_address(ray_two_nodes, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "tiny-llama", "--cluster", "v100-a100", "--job",
                 "gbs=64,seq_len=512", "--workers", f"ray:{ray_two_nodes.address}", "--top", "1",
                 "--json"]) == 0
    assert '"plans"' in capsys.readouterr().out


def test_unreachable_cluster_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama3.1-8b", "--cluster", "v100-a100", "--job",
                 "default", "--workers", "ray:127.0.0.1:1", "--top", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot start or reach Ray" in err and "Traceback" not in err
