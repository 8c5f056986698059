"""`hetpar probe`: the fit (no torch) recovers known parameters and prices as the simulator
does; the command runs on 2 gloo ranks at tiny sizes and writes files the other commands read;
bad options are one line, exit 2, before any measuring. No timing is asserted (CI is loaded)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from loadscale import deadline

from hetpar.catalog import load_cluster
from hetpar.cli import probe_files as files
from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.net.fit import Point, coefficients, fit_level, solve
from hetpar.sim import network as net
from hetpar.validation_collectives import predict, run_file

LAT, BW = 37e-6, 3.2e9  # seconds per ring step, bytes/s per rank
SIZES = (8, 512, 32768, 2**21, 2**25)


def synthetic(level: str, ranks: int, lat: float = LAT, bw: float = BW,
              ops: tuple[str, ...] = ("p2p", "all_reduce", "all_gather", "reduce_scatter"),
              reps: int = 3) -> list[Point]:
    """Points exactly on the model, each repetition scaled a little (a known spread)."""
    out = []
    for op in ops:
        c, d = coefficients(op, 2 if op == "p2p" else ranks)
        for s in SIZES:
            t = c * lat + d * s / bw
            out.append(Point(level=level, op=op, ranks=2 if op == "p2p" else ranks,
                             size_bytes=s, seconds=tuple(t * (1 + 0.1 * r) for r in range(reps))))
    return out


def test_coefficients_are_the_ring_form() -> None:
    # Patarasuk & Yuan: all-reduce 2(n-1) steps and 2(n-1)/n of the bytes; gather/scatter half
    assert coefficients("all_reduce", 4) == pytest.approx((6.0, 1.5))
    assert coefficients("all_gather", 4) == pytest.approx((3.0, 0.75))
    assert coefficients("reduce_scatter", 8) == pytest.approx((7.0, 7 / 8))
    assert coefficients("p2p", 2) == (1.0, 1.0)


@pytest.mark.parametrize("ops", [("all_reduce",), ("p2p", "all_reduce", "all_gather")])
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_fit_recovers_known_parameters_exactly(ops: tuple[str, ...], ranks: int) -> None:
    pts = synthetic("scale-up", ranks, reps=1)
    f = fit_level(pts, "scale-up", ops)
    assert f.latency_s == pytest.approx(LAT, rel=1e-9)
    assert f.bandwidth_bytes_s == pytest.approx(BW, rel=1e-9)
    assert f.residual_mape_pct == pytest.approx(0.0, abs=1e-7)
    assert f.points == len(ops) * len(SIZES) and f.ops == ops


def test_noise_by_a_factor_either_way_leaves_the_fit_unbiased() -> None:
    # every size measured 2x slow and 2x fast: the log fit returns the model (a fit of
    # relative residuals would lean fast: 2x slow costs 1, 2x fast 0.25)
    pts = [Point(level=p.level, op=p.op, ranks=p.ranks, size_bytes=p.size_bytes,
                 seconds=(p.seconds[0] * k,), statistic="min")
           for p in synthetic("scale-up", 4, reps=1) for k in (2.0, 0.5)]
    f = fit_level(pts, "scale-up", ("all_reduce", "all_gather"))
    assert f.latency_s == pytest.approx(LAT, rel=1e-6)
    assert f.bandwidth_bytes_s == pytest.approx(BW, rel=1e-6)


def test_a_sweep_that_never_leaves_the_latency_regime_is_refused() -> None:
    # 8 B - 512 B at 37 us per step and 3.2 GB/s: bytes take < 0.1% of the time; the line's
    # slope is then noise (1% here), so the fit refuses and names a size to reach
    pts = [p for p in synthetic("scale-up", 2, reps=1) if p.size_bytes <= 512]
    noisy = [Point(**{**p.__dict__, "seconds": (p.seconds[0] * (1.01 if i % 2 else 1),)})
             for i, p in enumerate(pts)]
    with pytest.raises(ConfigError, match=r"\(512 B\) is below the half-bandwidth size .* "
                                          r"allowed: --max-bytes >= "):
        fit_level(noisy, "scale-up", ("all_reduce",))


def test_the_spread_is_each_repetition_fitted_alone() -> None:
    # repetition r is the model x (1 + 0.1 r): latency and 1/bandwidth scale with it
    f = fit_level(synthetic("network", 2, reps=3), "network", ("all_reduce",))
    assert f.latency_range_s == pytest.approx((LAT, 1.2 * LAT), rel=1e-9)
    assert f.bandwidth_range_bytes_s == pytest.approx((BW / 1.2, BW), rel=1e-9)
    assert f.repetitions == 3
    assert f.latency_s == pytest.approx(LAT, rel=1e-9)  # the fastest repetition (default)
    med = [Point(**{**p.__dict__, "statistic": "median"}) for p in synthetic("network", 2)]
    g = fit_level(med, "network", ("all_reduce",))
    assert g.latency_s == pytest.approx(1.1 * LAT, rel=1e-9)  # the middle one


def test_times_that_do_not_grow_with_size_are_refused() -> None:
    with pytest.raises(ConfigError, match="no bandwidth can be fitted"):
        solve([(2.0, 2.0 * s, 1e-3) for s in (8, 4096)][:1] + [(2.0, 0.0, 1e-3)])
    with pytest.raises(ConfigError, match="needs at least two sizes"):
        fit_level(synthetic("scale-up", 2)[:1], "scale-up", ("p2p",))


def _doc(tmp_path: Path, nodes: int, per_node: int) -> Path:
    fits = {}
    if per_node > 1:
        fits["scale-up"] = fit_level(synthetic("scale-up", per_node, reps=1), "scale-up",
                                     ("all_reduce",))
    if nodes > 1:
        fits["network"] = fit_level(synthetic("network", nodes, 5 * LAT, BW / 4, reps=1),
                                    "network",
                                    ("all_reduce",))
    doc = files.cluster_doc("t", "A10", nodes, per_node, fits, "test", ["test"])
    path = tmp_path / "t.toml"
    path.write_text(files.cluster_text(doc, files.fit_lines(fits, {})))
    return path


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_the_written_file_prices_each_level_as_the_fit_does(tmp_path: Path, op: str) -> None:
    path = _doc(tmp_path, nodes=3, per_node=4)
    cluster = load_cluster(str(path))
    topo = net.topology(cluster)
    for devices, lat, bw, n in (([("probe", i) for i in range(4)], LAT, BW, 4),
                                ([("probe", 4 * i) for i in range(3)], 5 * LAT, BW / 4, 3)):
        c, d = coefficients(op, n)
        for s in SIZES:
            want = c * lat + d * s / bw
            shape = topo.with_usage(devices).shape(devices)
            assert net.collective(op)(shape, s) == pytest.approx(want, rel=1e-5)
            # and validate-collectives' row of it (one rank per node: the shared NIC whole)
            per = 4 if n == 4 else 1
            got = predict("t", op, n, per, s, tmp_path, cluster_ref=str(path))
            assert got == pytest.approx(s / want * d / 1e9, rel=1e-5)
    # a pipeline send inside a node: latency + bytes / bandwidth of the scale-up fit
    p = topo.p2p_path(("probe", 0), ("probe", 1))
    assert net.p2p(p, 2**20) == pytest.approx(LAT + 2**20 / BW, rel=1e-5)


def test_the_trace_has_one_event_per_sample_in_the_files_unit(tmp_path: Path) -> None:
    from hetpar.dynamic.trace import load_trace
    from hetpar.runtime.probe import Sample

    fit = fit_level(synthetic("scale-up", 2, reps=1), "scale-up", ("all_reduce",))
    c, d = coefficients("all_reduce", 2)
    t = c * fit.latency_s + d * 2**22 / (BW / 2)  # half the fitted bandwidth
    samples = [Sample(t_s=k, level="scale-up", node=0, ranks=2, size_bytes=2**22, seconds=t)
               for k in range(3)]
    path = tmp_path / "bw.csv"
    path.write_text(files.trace_text(samples, {"scale-up": fit}, 2, "c.toml", 3.0, "test"))
    tr = load_trace(str(path))
    assert [e.t_s for e in tr.events] == [0, 1, 2] and tr.cluster == "c.toml"
    assert tr.events[0].value == pytest.approx(files.gbps(BW / 2), rel=1e-5)


def test_ranks_group_by_host() -> None:
    pytest.importorskip("torch")
    from hetpar.runtime.probe import group_by_host, level_size

    assert group_by_host(["a", "b", "a", "b"]) == ((0, 2), (1, 3))
    with pytest.raises(ConfigError, match="ranks per host differ"):
        group_by_host(["a", "a", "b"])
    assert level_size(8, 4) == 16 and level_size(100, 2) == 104


def test_probe_runs_on_two_gloo_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out, trace = tmp_path / "p" / "c.toml", tmp_path / "p" / "bw.csv"
    code = main(["probe", "--gpu", "A10", "--ranks", "2", "--min-bytes", "256", "--max-bytes",
                 str(4 * 2**20), "--factor", "128", "--repeats", "2", "--warmup", "1",
                 "--out", str(out),
                 "--trace", str(trace), "--duration", "0.2", "--interval", "0.1", "--json"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["backend"] == "gloo" and r["nodes"] == [[0, 1]]
    g = load_cluster(str(out)).node_groups[0]
    assert (g.num_nodes, g.gpus_per_node, g.scaleup_kind) == (1, 2, "measured")
    for v in (g.scaleup_bandwidth_gbps, g.scaleup_latency_us):
        assert v is not None and math.isfinite(v) and v >= 0
    assert g.scaleup_bandwidth_gbps and g.scaleup_bandwidth_gbps > 0
    rows = run_file(tmp_path / "p" / "c-points.csv", cluster=str(out))
    assert {x.collective for x in rows} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert len(rows) == 3 * 3 and all(math.isfinite(x.error_pct) for x in rows)
    assert {p["op"] for p in r["points"]} == {"p2p", "all_reduce", "all_gather", "reduce_scatter"}
    from hetpar.dynamic.trace import load_trace

    assert load_trace(str(trace)).horizon_s == pytest.approx(0.2)


BAD = [
    (["--ops", "all_reduce,bcast"], "--ops 'bcast' not allowed; allowed: p2p, all_reduce"),
    (["--ops", "p2p", "--fit-ops", "all_reduce"], "--fit-ops 'all_reduce' not allowed"),
    (["--min-bytes", "64", "--max-bytes", "64"], "--min-bytes 64 not allowed"),
    (["--duration", "5"], "--duration/--interval/--trace-bytes apply to --trace only"),
    (["--trace-bytes", "64"], "apply to --trace only"),
    (["--out", "x.json"], "--out x.json: unknown extension '.json'"),
    (["--points", "x.txt"], "--points x.txt: unknown extension '.txt'"),
    (["--trace", "x.json"], "--trace x.json: unknown extension '.json'"),
    (["--device", "tpu"], "--device 'tpu' unknown"),
    (["--ranks", "1"], "--ranks: 1 not allowed; allowed: 2..1024"),
    (["--repeats", "0"], "--repeats"),
    (["--interval", "0", "--trace", "t.csv"], "--interval"),
    (["--out", "d.toml/"], "ends in '/'"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_are_one_line_before_measuring(
        argv: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from hetpar.runtime import probe as rp

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("measured before the options were checked")

    monkeypatch.setattr(rp, "measure", no_work)
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "--gpu", "A10", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_no_second_rank_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from hetpar.runtime import probe as rp

    monkeypatch.setattr(rp, "measure", lambda *a: pytest.fail("measured"))
    if torch.cuda.device_count() < 2:
        assert main(["probe", "--gpu", "A10", "--device", "cuda"]) == 2
        assert "NCCL needs one per rank" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["probe", "--gpu", "A10"]) == 2
    assert "torchrun started 1 rank; allowed: 2 or more" in capsys.readouterr().err


def test_an_unknown_gpu_or_cluster_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--gpu", "H100-typo"]) == 2
    assert "unknown gpu 'H100-typo'" in capsys.readouterr().err
    assert main(["validate-collectives", "validation/collectives/nccl-tests.csv",
                 "--cluster", "nope-cluster"]) == 2
    assert "nope-cluster" in capsys.readouterr().err


def test_two_hosts_give_a_network_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # 4 forked ranks told they sit on hosts h0, h1, h0, h1: the grouping, the per-node and the
    # leaders' communicators, and the file's NIC fields, without a second machine
    pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    real = socket.gethostname
    monkeypatch.setattr(socket, "gethostname", lambda: f"h{dist.get_rank() % 2}"
                        if dist.is_initialized() else real())
    out = tmp_path / "c.toml"
    code = main(["probe", "--gpu", "A10", "--ranks", "4", "--ops", "all_reduce,p2p",
                 "--min-bytes", "256", "--max-bytes", str(2**22), "--factor", "128",
                 "--repeats", "2", "--warmup", "0", "--out", str(out), "--json"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["nodes"] == [[0, 2], [1, 3]] and set(r["fits"]) == {"scale-up", "network"}
    g = load_cluster(str(out)).node_groups[0]
    assert (g.num_nodes, g.gpus_per_node, g.nic_kind, g.nic_shared) == (2, 2, "measured", True)
    assert g.nic_bandwidth_gbps == pytest.approx(r["fits"]["network"]["bandwidth_gbps"] / 2,
                                                 rel=1e-5)
    rows = run_file(tmp_path / "c-points.csv", cluster=str(out))
    assert sorted({(x.system, x.collective) for x in rows}) == [("c", "all_reduce")]
    assert len(rows) == 2 * 3 and all(math.isfinite(x.error_pct) for x in rows)


def test_under_torchrun_rank_zero_alone_writes_and_reports(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    out = tmp_path / "c.toml"
    p = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m",
                        "hetpar.cli.main", "probe", "--gpu", "A10", "--ops", "all_reduce",
                        "--min-bytes", "256", "--max-bytes", str(2**22), "--factor", "128",
                        "--repeats", "2", "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=deadline(120))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count('"cluster_file"') == 1  # one report: rank 0's
    r = json.loads(p.stdout[p.stdout.index("{"):])
    assert r["nodes"] == [[0, 1]] and r["backend"] == "gloo"
    assert load_cluster(str(out)).node_groups[0].gpus_per_node == 2
