"""Bad cells in the validation CSVs: one line naming the cell, never a traceback."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hetpar.cli.main import main
from hetpar.validation.rows import BUNDLED_RUNS

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
