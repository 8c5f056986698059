"""Heterogeneous validation index (the AMP runs shipped in the package); plan precision wins."""

import csv
import json
import shutil

import pytest

from hetpar.catalog import load_job, load_model, load_plan
from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.sim import simulate
from hetpar.validation_hetero import (
    BUNDLED,
    COLUMNS,
    load_run_cluster,
    mape,
    read_index,
    render,
    validate,
)

RUN = BUNDLED.parent / "amp-hc-00"
MODEL = BUNDLED.parent / "models" / "amp-gpt2-medium.toml"


@pytest.fixture(scope="module")
def results():
    return validate(read_index(BUNDLED))


def test_every_bundled_run_is_predicted(results):
    assert len(results) == 43
    assert [r.status for r in results] == ["ok"] * 43, [r.reason for r in results]
    assert all(r.predicted and r.predicted > 0 for r in results)


def test_mape_meets_the_issue_target(results):
    # Issue 17's target is 25%. The set stood at 29.2% after the network layer and the refit;
    # the g4dn.12xlarge's intra-node path stated as what it is (SHM through host memory, two
    # T4s per PCIe Gen3 x16 switch uplink: the clusters' comments) and one shared NIC per
    # instance bring it to 23.8% (docs/hetero-validation.md). The TP+PP runs with many small
    # micro-batches stay too fast.
    m = mape(results)
    assert m is not None and m <= 25.0, m


def test_cli_json_keys_and_dispatch_by_columns(capsys):
    assert main(["validate", str(BUNDLED), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 43 and out["mape_pct"] is not None
    assert set(out["rows"][0]) == {"row_id", "predicted_tokens_per_s", "measured_tokens_per_s",
                                   "error_pct", "status", "reason"}


def test_index_paths_resolve_from_any_folder(tmp_path, monkeypatch):
    # A copy elsewhere, run from an unrelated working directory: paths are index-relative.
    dst = tmp_path / "hetero"
    shutil.copytree(BUNDLED.parent, dst)
    monkeypatch.chdir(tmp_path.parent)
    rows = read_index(dst / "runs.csv")[:2]
    assert [r.status for r in validate(rows)] == ["ok", "ok"]


def test_wrong_columns_are_a_config_error(tmp_path):
    bad = tmp_path / "runs.csv"
    bad.write_text(",".join(COLUMNS[:-1]) + ",extra,cluster_file\n")
    with pytest.raises(ConfigError, match="column"):
        read_index(bad)


def test_plan_precision_wins_over_the_job_default():
    plan = load_plan(str(RUN / "plan.toml"))
    assert plan.precision == "fp16"
    model, cluster = load_model(str(MODEL)), load_run_cluster(RUN / "cluster.toml")
    # The job does not state a precision: its default (bf16) must not override the plan's fp16
    # (V100 and T4 have no bf16 peak, so a bf16 simulation would be infeasible).
    default_job = simulate(model, cluster, plan, load_job("gbs=32,seq_len=1024"))
    stated_job = simulate(model, cluster, plan, load_job("gbs=32,seq_len=1024,precision=fp16"))
    assert default_job.iteration_time_s == stated_job.iteration_time_s


def test_conflicting_precisions_are_a_one_line_error(capsys, monkeypatch):
    monkeypatch.chdir(RUN)
    code = main(["simulate", "--model", str(MODEL), "--cluster", "cluster.toml",
                 "--plan", "plan.toml", "--job", "gbs=32,seq_len=1024,precision=bf16"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "'fp16'" in err and "'bf16'" in err


def test_a_broken_run_is_unsupported_with_the_file_named(tmp_path):
    dst = tmp_path / "hetero"
    shutil.copytree(BUNDLED.parent, dst)
    text = (dst / "runs.csv").read_text().replace("amp-hc-01/plan.toml", "amp-hc-01/missing.toml")
    (dst / "runs.csv").write_text(text)
    rows = read_index(dst / "runs.csv")[:2]
    ok, bad = validate(rows)
    assert ok.status == "ok"
    assert bad.status == "unsupported" and "missing.toml" in bad.reason


def test_bundled_index_names_its_framework_in_the_job():
    rows = read_index(BUNDLED)
    assert all(load_job(r["job"]).framework == "megatron-deepspeed" for r in rows)


def test_an_optional_framework_column_sets_the_framework(tmp_path):
    dst = tmp_path / "hetero"
    shutil.copytree(BUNDLED.parent, dst)
    lines = (dst / "runs.csv").read_text().replace(",framework=megatron-deepspeed", "")
    lines = lines.splitlines()
    head, rows = lines[0], lines[1:3]
    (dst / "runs.csv").write_text("\n".join([head + ",framework"] + [rows[0] + ",",
                                            rows[1] + ",megatron-deepspeed"]) + "\n")
    plain, named = validate(read_index(dst / "runs.csv"))
    bundled = validate(read_index(BUNDLED)[:2])
    assert named.predicted == pytest.approx(bundled[1].predicted, rel=1e-12)
    assert plain.status == named.status == "ok"
    # a column that contradicts the job's framework is an error naming both
    (dst / "runs.csv").write_text(head + ",framework\n" + rows[0].replace(
        "precision=fp16", "precision=fp16,framework=fsdp") + ",megatron-deepspeed\n")
    (bad,) = validate(read_index(dst / "runs.csv"))
    assert bad.status == "unsupported" and "'fsdp'" in bad.reason


def test_the_table_reports_each_source_on_its_own_line(tmp_path):
    # The set is meant to grow by sources (README "Other sources"); each source's runs must be
    # counted and scored apart. Two AMP runs relabelled as another source stand in for one.
    dst = tmp_path / "hetero"
    shutil.copytree(BUNDLED.parent, dst)
    lines = (dst / "runs.csv").read_text().splitlines()
    head, rows = lines[0], lines[1:4]
    amp = next(csv.reader([rows[0]]))[1]
    relabelled = [r.replace(f'"{amp}"', '"Other source"', 1) for r in rows[1:]]
    assert all("Other source" in r for r in relabelled)
    (dst / "runs.csv").write_text("\n".join([head, rows[0], *relabelled]) + "\n")
    results = validate(read_index(dst / "runs.csv"))
    table = {ln.split("  ")[0]: ln.split() for ln in render(results).splitlines()}
    amp_line = next(v for k, v in table.items() if k.startswith("source AMP"))
    other = table["source Other source"]
    assert amp_line[-5:-3] == ["1", "1"] and other[-5:-3] == ["2", "2"]
    errs = [abs(r.error_pct) for r in results[1:] if r.error_pct is not None]
    assert other[-3] == f"{sum(errs) / len(errs):.1f}%"
