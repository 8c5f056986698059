"""--workers for the failure analyses and replay: worker processes and a two-node Ray cluster
give the same numbers as one process; the pool keeps item order whatever the chunking."""

from __future__ import annotations

import json
import operator
import pickle
from collections import Counter
from pathlib import Path

import pytest

import hetpar.failures.sweep as sweep_mod
from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli.main import main
from hetpar.failures import analysis as A
from hetpar.failures.policies import PolicyConfig
from hetpar.workers import Pool, Processes, RayPool, Workers, chunk_size, open_pool, parse_workers

FAILURES = ["failures", "--model", "llama3.1-8b", "--cluster", "h100-pod-400g", "--plan",
            "tp=8,pp=2,dp=64,mbs=1,gbs=256", "--days", "5", "--samples", "6",
            "--fractions", "0.002,0.01", "--json"]
REPLAY = ["replay", "--model", "llama3.1-70b", "--cluster", "two-zone-a100", "--job",
          "gbs=512", "--policy", "all", "--json"]
TRACE = ("# horizon_s: 7200\nt_s,kind,target,value,node,nodes\n"  # the zones' link dips 20x
         "600,factor,link:zone-a/zone-b,0.05,,\n4000,factor,link:zone-a/zone-b,1,,\n")


@pytest.fixture
def trace(tmp_path: Path) -> str:
    path = tmp_path / "dip.csv"
    path.write_text(TRACE)
    return str(path)


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _replay(capsys: pytest.CaptureFixture[str], trace: str, workers: str) -> dict:
    data = _cli(capsys, [*REPLAY, "--trace", trace, "--workers", workers])
    for r in data["results"]:
        assert len(r.pop("decision_s")) > 0  # wall times of the decisions: never reproducible
    return data


def _scale(x: int, y: int) -> int:
    return x * y


def test_the_pool_keeps_order_and_ships_each_shared_object() -> None:
    ticks: list[int] = []
    with Processes(2) as pool:
        items = list(range(37))  # chunks of 5: the last one short
        got = pool.map(_scale, items, 3, tick=lambda: ticks.append(1))
        assert got == [3 * i for i in items] and len(ticks) == 37
        assert pool.map(_scale, items, 5) == [5 * i for i in items]  # a new shared object
    assert open_pool(Workers()).map(_scale, items, 2) == [2 * i for i in items]


def _copies_of_shared(pool: Pool) -> tuple[int, int, int]:
    """How many copies of ``shared`` the workers made: ``next`` on a shared iterator numbers
    the items each copy has seen, so each 0 is a fresh copy. Returns the copies in a first
    map, in a second map with the same object, and in a map with a new object."""
    items = [None] * 40  # next's default, never reached
    counter = iter(range(1000))
    first = pool.map(next, items, counter)
    second = pool.map(next, items, counter)
    third = pool.map(next, items, iter(range(1000)))
    seen = Counter(first + second)  # each copy counts up from 0: runs 0..k-1, one per copy
    assert all(seen[v] <= seen[v - 1] for v in seen if v > 0)
    return first.count(0), second.count(0), third.count(0)


def test_the_workers_keep_one_copy_of_shared_across_chunks_and_maps() -> None:
    assert chunk_size(40, 2) == 5  # 8 chunks for 2 workers: a copy per chunk would make 8
    with Processes(2) as pool:
        first, second, third = _copies_of_shared(pool)
    # at most one copy per worker over both maps of one object: a worker the first map left
    # idle (the executor starts processes on demand) makes its one copy in the second
    assert first >= 1 and first + second <= 2 and 1 <= third <= 2
    assert _copies_of_shared(Pool()) == (1, 0, 1)


def test_workers_option_values() -> None:
    assert parse_workers("3") == Workers(processes=3)
    assert parse_workers("ray") == Workers(ray_address="local")
    assert str(parse_workers("ray:10.0.0.1:6379")) == "ray:10.0.0.1:6379"
    for bad in ("0", "rayy", "2.5"):
        with pytest.raises(Exception, match="--workers"):
            parse_workers(bad)


def test_worker_processes_are_capped_by_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # hundreds of forked planners (a fuzzed --workers 700) exhausted a 24 GiB machine's RAM
    from hetpar.errors import ConfigError
    from hetpar.workers import open_pool

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert parse_workers("8") == Workers(processes=8)
    with pytest.raises(ConfigError, match=r"--workers 9 is more than 4 x this machine's 2 CPUs"):
        parse_workers("9")
    with pytest.raises(ConfigError, match="workers 700 is more than"):
        open_pool(Workers(processes=700))


def test_sweep_draws_do_not_depend_on_the_batching(monkeypatch: pytest.MonkeyPatch) -> None:
    s = A.make_setup(load_model("llama3.1-8b"), load_cluster("h100-pod-400g"),
                     load_plan("tp=8,pp=2,dp=64,mbs=1,gbs=256"), config=PolicyConfig())
    kw = {"samples": 7, "seed": 5, "policies": ("drop", "ntp"), "pool_units": s.pool_units}
    whole = sweep_mod.sweep(s.ev, (0.002, 0.01), **kw)
    monkeypatch.setattr(sweep_mod, "BATCH", 3)
    with Processes(2) as pool:
        assert sweep_mod.sweep(s.ev, (0.002, 0.01), pool=pool, **kw) == whole
    # the simulator-backed cost, caches included, travels to Ray workers by pickling
    ev = pickle.loads(pickle.dumps(s.ev))
    assert sweep_mod.sweep(ev, (0.002, 0.01), **kw) == whole


def test_failures_on_processes_equal_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    one = _cli(capsys, [*FAILURES, "--workers", "1"])
    assert one["sweep"]["loss"]["ntp"] and one["monte_carlo"]["failures"] > 0
    assert _cli(capsys, [*FAILURES, "--workers", "2"]) == one


def test_replay_on_processes_equals_one_process(
        trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    one = _replay(capsys, trace, "1")
    assert [r["policy"] for r in one["results"]] == ["static", "adaptive", "oracle"]
    assert [len(r["switches"]) for r in one["results"]] == [0, 1, 2]
    assert _replay(capsys, trace, "3") == one


def test_failures_across_two_ray_nodes_equal_one_process(
        ray_two_nodes, capsys: pytest.CaptureFixture[str]) -> None:
    one = _cli(capsys, [*FAILURES, "--workers", "1"])
    assert _cli(capsys, [*FAILURES, "--workers", f"ray:{ray_two_nodes.address}"]) == one


def test_replay_across_two_ray_nodes_equals_one_process(
        ray_two_nodes, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    one = _replay(capsys, trace, "1")
    assert _replay(capsys, trace, f"ray:{ray_two_nodes.address}") == one


def test_unreachable_ray_is_one_line(
        trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="ray extra not installed: pip install -e .[ray]")
    for argv in (FAILURES, [*REPLAY, "--trace", trace]):
        assert main([*argv, "--workers", "ray:127.0.0.1:1"]) == 2
        out = capsys.readouterr()
        assert "cannot start or reach Ray at 127.0.0.1:1" in out.err
        assert "Traceback" not in out.err and out.out == ""


def test_ray_workers_fetch_shared_once_per_worker(ray_two_nodes) -> None:
    """One Ray actor per CPU holds ``shared``: plain tasks resolved it from the object store
    into a new object every chunk (8 copies here), with the simulator's identity-keyed
    caches cold each time."""
    with RayPool(ray_two_nodes.address) as pool:
        assert pool.workers == 2
        first, second, third = _copies_of_shared(pool)
        # chunks go to whichever actor is free; results still come back in item order
        assert pool.map(operator.mul, list(range(37)), 3) == [3 * i for i in range(37)]
    assert first >= 1 and first + second <= 2 and 1 <= third <= 2  # one per actor at most
