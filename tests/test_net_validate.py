"""The collective validation command: JSON rows, MAPE, and one-line errors on bad input."""

import json
from pathlib import Path

from hetpar.cli.main import main

CSV = Path(__file__).parents[1] / "validation" / "collectives" / "nccl-tests.csv"


def test_validate_collectives_json(capsys):
    assert main(["validate-collectives", str(CSV), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 26 and out["mape_pct"] is not None
    row = out["rows"][0]
    assert {"row_id", "predicted_busbw_gbyte_s", "measured_busbw_gbyte_s", "error_pct"} <= set(row)
    err = 100 * (row["predicted_busbw_gbyte_s"] - row["measured_busbw_gbyte_s"]) / row[
        "measured_busbw_gbyte_s"]
    assert abs(err - row["error_pct"]) < 1e-9


def test_validate_collectives_bad_column_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("row_id,system\n1,a\n")
    assert main(["validate-collectives", str(bad)]) == 2
    assert "columns must be" in capsys.readouterr().err
