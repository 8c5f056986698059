"""`hetpar simulate` and `hetpar validate` end to end, and the golden default report."""

import json
import os
from pathlib import Path

import pytest

from hetpar.catalog import load_cluster, load_job, load_model, load_plan
from hetpar.cli.main import main
from hetpar.sim import simulate
from hetpar.validation.rows import BUNDLED_RUNS

GOLDEN = Path(__file__).parent / "golden" / "simulate_default.json"
RUNS = BUNDLED_RUNS  # the development set ships with the package: no skip on a fresh clone


def _rounded(x, digits=9):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, digits) for v in x]
    return x


def test_default_example_matches_the_golden_report():
    """The bundled example; regenerate with HETPAR_UPDATE_GOLDEN=1 when physics changes on
    purpose (and say why in the commit)."""
    rep = simulate(load_model("llama3.1-70b"), load_cluster("h100-pod-400g"),
                   load_plan("default"), load_job("default"), collectives=True)
    data = _rounded(rep.to_dict())
    if os.environ.get("HETPAR_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    assert data == json.loads(GOLDEN.read_text())
    assert not rep.oom and rep.num_gpus == 1024


def test_simulate_without_arguments_prints_the_default_report(capsys):
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    golden = json.loads(GOLDEN.read_text())
    assert "llama3.1-70b on h100-pod-400g (1024 GPUs)" in out
    assert f"{golden['iteration_time_s']:.3f} s" in out
    assert "out of memory" in out and "time breakdown" in out and "capacity" in out


def test_simulate_json_and_inline_plan(capsys):
    args = ["simulate", "--model", "llama3.1-8b", "--cluster", "selene-a100", "--plan",
            "tp=2,pp=2,dp=2,mbs=1,gbs=16", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "tokens_per_s_per_gpu", "mfu", "hfu", "oom", "bottleneck",
                "breakdown", "memory"):
        assert key in data
    assert data["num_gpus"] == 8 and len(data["memory"]) == 2
    assert data["tokens_per_iter"] == 16 * 8192


def test_inline_job_sets_batch_and_sequence(capsys):
    job = load_job("gbs=64,seq=2048,precision=fp16")
    assert (job.global_batch, job.seq_len, job.precision) == (64, 2048, "fp16")
    args = ["simulate", "--model", "llama3.1-8b", "--cluster", "selene-a100", "--plan",
            "tp=2,pp=2,dp=2,mbs=1,gbs=32", "--job", "gbs=32,seq_len=1024", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["tokens_per_iter"] == 32 * 1024
    assert main(["simulate", "--job", "gbs=8,bogus=1"]) == 2
    assert "inline job: unknown key 'bogus'" in capsys.readouterr().err


def test_trace_is_a_chrome_trace_of_every_rank(tmp_path, capsys):
    trace = tmp_path / "t.json"
    args = ["simulate", "--model", "llama3.1-8b", "--cluster", "selene-a100", "--plan",
            "tp=2,pp=4,dp=2,mbs=1,gbs=16", "--trace", str(trace)]
    assert main(args) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    ranks = [n for n in names if "pp rank" in n]
    assert len(ranks) == 4 and all("replicas 0-1" in n for n in ranks)
    spans = [e for e in events if e["ph"] == "X"]
    kinds = {e["cat"] for e in spans}
    assert {"forward", "backward", "optimizer"} <= kinds
    # 8 micro-batches x (F + B) per rank
    assert sum(e["cat"] in ("forward", "backward") for e in spans) == 4 * 8 * 2


@pytest.mark.parametrize("args,needle", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--cluster", "nope"], "unknown cluster 'nope'"),
    (["--plan", "tp=x,gbs=4"], "tp"),
    (["--plan", "tp=2,pp=1,dp=1,mbs=1,gbs=4,schedule=bogus"], "schedule"),
    (["--model", "llama3.1-8b", "--plan", "tp=3,pp=1,dp=1,mbs=1,gbs=4"], "divisible"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, needle, capsys):
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_validate_json_shape(tmp_path, capsys):
    lines = RUNS.read_text().splitlines(keepends=True)
    small = tmp_path / "runs.csv"
    small.write_text("".join(lines[:4]))
    assert main(["validate", str(small), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"rows", "mape_pct", "pairwise_order_pct", "pairs",
                         "interval_coverage_pct", "interval_coverage_by_source",
                         "misordered_pairs"}
    (by,) = data["interval_coverage_by_source"].values()
    assert by["rows"] == 3 and by["band_reachable"] is False
    inside = [r["interval_tokens_per_s_per_gpu"][0] <= r["measured_tokens_per_s_per_gpu"]
              <= r["interval_tokens_per_s_per_gpu"][1] for r in data["rows"]]
    assert data["interval_coverage_pct"] == pytest.approx(100 * sum(inside) / 3)
    assert len(data["rows"]) == 3
    assert set(data["rows"][0]) == {"row_id", "predicted_tokens_per_s_per_gpu",
                                    "measured_tokens_per_s_per_gpu", "error_pct", "status",
                                    "reason", "interval_tokens_per_s_per_gpu"}
    errs = [abs(r["error_pct"]) for r in data["rows"]]
    assert data["mape_pct"] == pytest.approx(sum(errs) / 3)
    assert main(["validate", str(small), "--rows"]) == 0
    out = capsys.readouterr().out
    assert "MAPE" in out and out.count("\n") >= 6


def test_validate_rejects_other_columns(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["validate", str(bad)]) == 2
    assert "missing column" in capsys.readouterr().err


def test_timeline_tracks_cover_every_replica_structure():
    import dataclasses

    from hetpar.specs.expand import expand
    from hetpar.specs.plan import Plan

    model, cluster = load_model("llama3.1-8b"), load_cluster("mixed-a100-h100")
    a100, h100 = (g.name for g in cluster.node_groups)
    uniform = Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8)
    fast = expand(dataclasses.replace(uniform, group=h100), model, cluster)
    slow = expand(dataclasses.replace(uniform, group=a100), model, cluster)
    plan = dataclasses.replace(fast, replicas=(fast.replicas[0], slow.replicas[1]))
    rep = simulate(model, cluster, plan, timeline=True)
    tracks = {e.track for e in rep.timeline if "pp rank" in e.track}
    assert len(tracks) == 4  # two structures x two pipeline ranks
    assert any("replicas 0 " in t and "h100" in t for t in tracks)
    assert any("replicas 1 " in t and "a100" in t for t in tracks)
    assert "timeline" in rep.to_dict() and "timeline" not in simulate(model, cluster,
                                                                     plan).to_dict()
