"""`hetpar calibrate` writes GPU and cluster files that load strictly and drive the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loadscale import deadline

from hetpar.catalog import load_cluster, load_gpu, load_model, parse_inline_plan
from hetpar.cli.main import main
from hetpar.runtime.calibrate import collective_fit
from hetpar.sim import simulate

pytestmark = pytest.mark.timeout(deadline(120))


def test_calibrate_writes_loadable_files(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c" / "local.toml"
    assert main(["calibrate", "--quick", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    gpu = load_gpu(res["gpu_file"])
    cluster = load_cluster(str(out))
    assert cluster.node_groups[0].gpus_per_node == 2
    # The peak is the best measured matmul rate, so the table tops out at exactly 1.
    assert max(gpu.matmul_efficiency.fraction) == 1.0
    assert res["collective"]["bandwidth_bytes_s"] > 0 and res["collective"]["latency_s"] > 0
    model = load_model("tiny-gpt")
    plan = parse_inline_plan("tp=2,gbs=4,mbs=2,precision=fp32")
    rep = simulate(model, cluster, plan)
    assert 0 < rep.iteration_time_s < 60
    assert not list(tmp_path.rglob("*.tmp"))


def test_collective_fit_inverts_the_ring_model() -> None:
    # Synthetic times from t = 2 (n-1) lat + 2 (n-1)/n bytes / bw must give lat and bw back.
    lat, bw, n = 50e-6, 2e9, 4
    sizes = [2**8, 2**12, 2**16, 2**20]
    times = [2 * (n - 1) * lat + 2 * (n - 1) / n * 4 * s / bw for s in sizes]
    fit = collective_fit(n, sizes, times)
    assert fit["latency_s"] == pytest.approx(lat, rel=1e-6)
    assert fit["bandwidth_bytes_s"] == pytest.approx(bw, rel=1e-6)


def test_calibrate_rejects_bad_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--ranks", "0", "--out", "/nonexistent/x.toml"]) == 2
    assert "--ranks" in capsys.readouterr().err
