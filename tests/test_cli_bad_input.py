"""Bad cells in the validation CSVs: one line naming the cell, never a traceback."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hetpar.cli.main import main
from hetpar.validation.rows import BUNDLED_RUNS, COLUMNS

COLLECTIVES = Path(__file__).parents[1] / "validation" / "collectives" / "nccl-tests.csv"


def _collectives(tmp_path: Path, edit: str) -> Path:
    """The bundled collectives CSV's header and first row, changed by ``edit``."""
    header, first = COLLECTIVES.read_text(encoding="utf-8").splitlines()[:2]
    cells = first.split(",")
    if edit == "short":
        row = ",".join(cells[:3])
    elif edit == "extra":
        row = first + ",x"
    else:
        key, value = edit.split("=")
        cells[header.split(",").index(key)] = value
        row = ",".join(cells)
    p = tmp_path / "c.csv"
    p.write_text(f"{header}\n{row}\n", encoding="utf-8")
    return p


@pytest.mark.parametrize(("edit", "says"), [
    ("short", "fewer cells than the 8 columns"),  # was a TypeError traceback (int(None))
    ("extra", "more cells than the 8 columns"),  # was accepted silently
    ("measured_busbw_gbyte_s=nan", "measured_busbw_gbyte_s='nan' not allowed"),  # was MAPE nan
    ("measured_busbw_gbyte_s=inf", "measured_busbw_gbyte_s='inf' not allowed"),
    ("gpus=x", "gpus='x' is not an integer"),  # named no column
    ("gpus=1", "gpus='1' not allowed; allowed: finite, >= 2"),
    ("size_bytes=0", "size_bytes='0' not allowed"),
])
def test_bad_collectives_cell_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str, says: str
) -> None:
    assert main(["validate-collectives", str(_collectives(tmp_path, edit))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.parametrize("key", ["gpus_per_node", "num_gpus"])
def test_zero_gpus_in_a_runs_row_is_unsupported_with_its_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    with Path(BUNDLED_RUNS).open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        row = next(reader)
        fields = list(reader.fieldnames or ())
    row[key] = "0"  # was a ZeroDivisionError traceback in cluster_of
    p = tmp_path / "r.csv"
    with p.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerow(row)
    assert main(["validate", str(p), "--json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)["rows"]
    assert res["status"] == "unsupported"
    assert f"{key}=0" in res["reason"] and "allowed: both >= 1" in res["reason"], res


# DeepSpeed leaves such a plan to the user's train.py on purpose (test_export_deepspeed_train.py)
@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_export_refuses_a_tp_that_does_not_split_the_heads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    out = tmp_path / "x"
    # simulate and run --dry-run call tp=3 of 32 heads infeasible; export wrote a script (exit 0)
    assert main(["export", "--model", "llama3.1-8b", "--plan", "tp=3,gbs=9", "--to", target,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_heads (32) not divisible by tp (3)" in err[0], err
    assert not list(tmp_path.iterdir())  # nothing written


# ----------------------------------------------------------------- the CLI audit (branch bad2)
FIXI = Path(__file__).parent / "fixtures" / "importers"
HOSTFILE = str(FIXI / "metis" / "hostfile")
SMALL_FAILURES = ["failures", "--model", "llama3.1-8b", "--cluster", "h100-pod-400g", "--plan",
                  "tp=8,pp=2,dp=64,mbs=1,gbs=256", "--days", "0", "--samples", "0",
                  "--cost", "analytic"]
PLAN = ["plan", "--model", "llama3.1-8b", "--cluster", "gpu=H100-SXM5-80GB,nodes=1",
        "--job", "gbs=8", "--top", "1", "--workers", "1"]


def _err(capsys: pytest.CaptureFixture[str], argv: list[str], rc: int = 2) -> list[str]:
    """Run ``hetpar argv``: the exit code is ``rc``, stderr has no traceback; its lines."""
    assert main(argv) == rc
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], *says: str) -> None:
    """Exit 2 with one line naming every one of ``says`` (the field and its value)."""
    err = _err(capsys, argv)
    assert len(err) == 1 and err[0].startswith("hetpar:"), err
    assert all(s in err[0] for s in says), err


def _warned(capsys: pytest.CaptureFixture[str], argv: list[str], *says: str) -> None:
    """Exit 0 with exactly one warning line on stderr naming ``says``."""
    warnings = [x for x in _err(capsys, argv, rc=0) if x.startswith("hetpar: warning:")]
    assert len(warnings) == 1 and all(s in warnings[0] for s in says), warnings


def test_failed_fraction_states_its_range_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ntp.toml"
    # was "plan: global_batch must be >= 1, got 0", naming neither the option nor the value
    _one_line(capsys, [*SMALL_FAILURES, "--write-plan", str(out), "--failed-fraction", "1"],
              "--failed-fraction: 1 not allowed; allowed: >= 0 and < 1")
    _one_line(capsys, [*SMALL_FAILURES, "--write-plan", str(out), "--failed-fraction", "0.9"],
              "--failed-fraction 0.9: 922 of 1024 GPUs failed leave no replica")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("opt", "value"), [("--write-policy", "drop-packed"),
                                            ("--failed-fraction", "0.01")])
def test_write_plan_options_without_write_plan_are_warned_about(
    capsys: pytest.CaptureFixture[str], opt: str, value: str
) -> None:
    # was silently ignored
    _warned(capsys, [*SMALL_FAILURES, opt, value], f"{opt} {value} applies only with --write-plan")


@pytest.mark.parametrize(("argv", "says"), [
    # --json with a .toml --out wrote JSON into x.toml
    (["--json", "--out", "OUT/x.toml"], ("--json with --out", "x.toml")),
    (["--gpu", "H100"], ("--gpu does not apply to --from metis",)),  # was ignored
    (["--model", "llama3.1-8b"], ("--model does not apply to --from metis",)),
    (["--out", "OUT/x.yaml"], ("--out", "x.yaml", "unknown extension '.yaml'")),
])
def test_import_refuses_options_that_do_not_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: tuple[str, ...]
) -> None:
    argv = [a.replace("OUT", str(tmp_path)) for a in argv]
    _one_line(capsys, ["import", "--from", "metis", HOSTFILE, *argv], *says)
    assert not list(tmp_path.iterdir())


def test_import_options_of_the_other_importers_are_refused(
    capsys: pytest.CaptureFixture[str]
) -> None:
    yml = str(FIXI / "astra-sim" / "network.yml")
    _one_line(capsys, ["import", "--from", "astra-sim", yml, "--gpu", "H100", "--cluster-file",
                       "x.json"], "--cluster-file does not apply to --from astra-sim")
    _one_line(capsys, ["import", "--from", "megatron", yml, "--model", "llama3.1-8b",
                       "--bandwidth-unit", "gbps"], "--bandwidth-unit does not apply")


def test_import_out_json_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"  # the extension picks the format, as --json does for stdout
    assert main(["import", "--from", "metis", HOSTFILE, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["name"] == "metis"


def test_metis_hostfile_listing_a_node_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hostfile"  # was accepted: the node's 8 GPUs counted twice
    hosts.write_text("10.0.0.1 slots=8\n10.0.0.2 slots=8\n10.0.0.1 slots=8\n")
    (tmp_path / "clusterfile.json").write_text((FIXI / "metis" / "clusterfile.json").read_text())
    _one_line(capsys, ["import", "--from", "metis", str(hosts)],
              "hostfile line 3: node 10.0.0.1 is listed twice (first on line 1)")


# Every single-file output: a name ending in "/" is refused (was: a file named "d" written)
DIR_OUTPUTS = [
    ("--out", ["import", "--from", "metis", HOSTFILE]),
    ("--out", ["export", "--model", "llama3.1-8b", "--plan", "tp=2,gbs=8", "--to", "megatron"]),
    ("--out", ["report", "--model", "llama3.1-8b", "--cluster", "gpu=H100-SXM5-80GB,nodes=1",
               "--plan", "tp=2,gbs=8"]),
    ("--trace", ["simulate", "--model", "llama3.1-8b", "--cluster", "gpu=H100-SXM5-80GB,nodes=1",
                 "--plan", "tp=2,gbs=8"]),
    ("--write-plan", SMALL_FAILURES),
    ("--plot", SMALL_FAILURES),
    ("--plot", ["replay", "--model", "tiny-llama", "--job", "gbs=64", "--trace",
                "straggler-node", "--policy", "static"]),
    ("--report", PLAN),
    ("--fit", ["validate", str(BUNDLED_RUNS)]),
    ("--out", ["calibrate"]),
    ("--out", ["probe", "--gpu", "A10"]),
    ("--points", ["probe", "--gpu", "A10"]),
    ("--trace", ["probe", "--gpu", "A10"]),
]


@pytest.mark.parametrize(("opt", "argv"), DIR_OUTPUTS, ids=[f"{a[0]}{o}" for o, a in DIR_OUTPUTS])
@pytest.mark.parametrize("name", ["d/", "d.toml/"])
def test_a_file_output_ending_in_a_slash_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], opt: str, argv: list[str], name: str
) -> None:
    path = f"{tmp_path}/{name}"
    _one_line(capsys, [*argv, opt, path], f"{opt} {path}: ends in '/', which names a directory")
    assert not list(tmp_path.iterdir())  # nothing written, no folder made


@pytest.mark.parametrize("price", ["nan", "inf", "-1", "0", "x"])
def test_plan_price_must_be_finite_and_positive(
    capsys: pytest.CaptureFixture[str], price: str
) -> None:
    # nan and inf were accepted (nan: every plan's tokens per dollar nan)
    _one_line(capsys, [*PLAN, "--objective", "cost", "--price", f"H100={price}"],
              f"--price H100={price!r} not allowed; allowed: a finite number > 0")


def test_plan_price_with_an_empty_gpu_name(capsys: pytest.CaptureFixture[str]) -> None:
    _one_line(capsys, [*PLAN, "--objective", "cost", "--price", "=2"],
              "--price: '=2' is not GPU=USD_per_hour")


@pytest.mark.parametrize(("opt", "value", "applies"), [("--budget", "3", "budget or cost"),
                                                       ("--target", "5", "min_gpus")])
def test_plan_budget_or_target_the_objective_does_not_use_is_warned_about(
    capsys: pytest.CaptureFixture[str], opt: str, value: str, applies: str
) -> None:
    # was silently ignored under the default throughput objective
    _warned(capsys, [*PLAN, opt, value], f"{opt} {value} ignored", applies)


def test_run_refuses_an_unknown_device_in_a_dry_run_too(
    capsys: pytest.CaptureFixture[str]
) -> None:
    # --dry-run --device tpu exited 0; the device was only checked before training
    _one_line(capsys, ["run", "--model", "tiny-llama", "--plan", "tp=2,gbs=8", "--dry-run",
                       "--device", "tpu"], "--device 'tpu' unknown; allowed: cpu, cuda, cuda:N")


def test_run_every_without_checkpoint_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    _warned(capsys, ["run", "--model", "tiny-llama", "--plan", "tp=2,gbs=8", "--dry-run",
                     "--every", "2"], "--every 2 applies only with --checkpoint")


TRACE = Path(__file__).parents[1] / "hetpar" / "catalog" / "traces" / "straggler-node.csv"


@pytest.mark.parametrize(("row", "says"), [  # straggler-node's cluster: h100-pod-400g
    ("10,factor,tier:rack,0.5,,,9",
     "7 cells, the column row has 6 (t_s,kind,target,value,node,nodes); cell 7 is '9'"),
    ("10,factor,tier:rack,0.5,3,", "node=3 does not apply to a factor event on tier:rack; "
     "it takes: value"),  # was ignored
    ("10,leave,group:h100,2,,1", "value=2 does not apply to a leave event on group:h100; "
     "it takes: nodes"),  # was ignored
])
def test_replay_trace_row_with_extra_values_names_row_and_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str, says: str
) -> None:
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    head = lines.index("t_s,kind,target,value,node,nodes")
    p = tmp_path / "t.csv"
    p.write_text("\n".join([*lines[:head + 1], row, *lines[head + 1:]]) + "\n", encoding="utf-8")
    _one_line(capsys, ["replay", "--model", "tiny-llama", "--job", "gbs=64", "--trace", str(p),
                       "--policy", "static"], f"t.csv:{head + 2}: " + says)


def test_describe_a_tp_that_does_not_split_the_heads_is_infeasible(
    capsys: pytest.CaptureFixture[str]
) -> None:
    # printed activation bytes for a tp=3 split of 32 heads, exit 0
    err = _err(capsys, ["describe", "model", "llama3.1-8b", "--tp", "3"])
    assert len(err) == 1 and "infeasible" in err[0], err
    assert "n_heads (32) not divisible by tp (3)" in err[0], err


def test_describe_model_options_for_another_kind_are_warned_about(
    capsys: pytest.CaptureFixture[str]
) -> None:
    _warned(capsys, ["describe", "gpus", "--tp", "2"], "--tp 2 applies only to `describe model")


def _cluster_file(tmp_path: Path, old: str, new: str) -> str:
    src = Path(__file__).parents[1] / "hetpar" / "catalog" / "clusters" / "two-zone-a100.toml"
    text = src.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    p = tmp_path / "c.toml"
    p.write_text(text.replace(old, new), encoding="utf-8")
    return str(p)


LINK = 'b = "zone-b"\nbandwidth_gbps = 12.5\nlatency_us = 1000.0'


@pytest.mark.parametrize(("old", "new", "says"), [
    (LINK, LINK.replace("12.5", "0"), "link zone-a-zone-b: bandwidth_gbps must be > 0, got 0"),
    (LINK, LINK.replace("1000.0", "-1"), "link zone-a-zone-b: latency_us must be >= 0, got -1"),
    ('name = "zone-a"\ngpu = "A100-SXM4-80GB"\nnum_nodes = 32',
     'name = "zone-a"\ngpu = "A100-SXM4-80GB"\nnum_nodes = 0',
     "node group 'zone-a': num_nodes must be >= 1, got 0"),
    ("size_gpus = 256              # one zone", "size_gpus = 1024",
     "tiers must go from smallest to largest size_gpus; got zone-fabric size_gpus=1024, "
     "dci size_gpus=0 (all 512)"),
])
def test_cluster_file_errors_name_the_field_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, says: str
) -> None:
    _one_line(capsys, ["describe", "cluster", _cluster_file(tmp_path, old, new)], says)


@pytest.mark.parametrize(("opt", "value", "says"), [
    ("--plan", "=2", "inline plan: '=2' in '=2' has an empty key"),
    ("--plan", "tp=2,=4,gbs=8", "inline plan: '=4' in 'tp=2,=4,gbs=8' has an empty key"),
    ("--cluster", "gpu=H100-SXM5-80GB,=1", "inline cluster: '=1' in"),
    ("--job", "gbs=8,=3", "inline job: '=3' in 'gbs=8,=3' has an empty key"),
])
def test_inline_empty_key_is_named(
    capsys: pytest.CaptureFixture[str], opt: str, value: str, says: str
) -> None:
    # was "missing key 'global_batch' in '=2'" / "unknown key ''"
    argv = {"--model": "llama3.1-8b", "--cluster": "gpu=H100-SXM5-80GB,nodes=1",
            "--plan": "tp=2,gbs=8", opt: value}
    _one_line(capsys, ["simulate", *[x for kv in argv.items() for x in kv]], says)


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty file; expected a header row"),
    (",".join(COLUMNS) + "\n", "no runs (a header row and no data rows)"),  # was exit 0
])
def test_validate_an_empty_runs_csv_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    p = tmp_path / "runs.csv"
    p.write_text(text, encoding="utf-8")
    _one_line(capsys, ["validate", str(p), "--json"], f"{p}: {says}")
