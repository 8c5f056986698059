"""The collective validation command: JSON rows, MAPE, and one-line errors on bad input."""

import json
from pathlib import Path

from hetpar.cli.main import main

CSV = Path(__file__).parents[1] / "validation" / "collectives" / "nccl-tests.csv"


def test_validate_collectives_json(capsys):
    assert main(["validate-collectives", str(CSV), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lines = CSV.read_text(encoding="utf-8").splitlines()
    assert len(out["rows"]) == len(lines) - 1 and out["mape_pct"] is not None
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


def test_validate_collectives_reports_each_system_and_both_size_classes(capsys):
    assert main(["validate-collectives", str(CSV), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows, systems = out["rows"], out["systems"]
    assert sum(s["rows"] for s in systems) == len(rows)
    mib = 2**20
    for s in systems:
        own = [r for r in rows if r["system"] == s["system"]]
        big = [abs(r["error_pct"]) for r in own if r["size_bytes"] >= mib]
        small = [abs(r["error_pct"]) for r in own if r["size_bytes"] < mib]
        assert s["mape_ge_1mib_pct"] == (sum(big) / len(big) if big else None)
        assert s["mape_lt_1mib_pct"] == (sum(small) / len(small) if small else None)
    every = [abs(r["error_pct"]) for r in rows if r["size_bytes"] >= mib]
    assert out["mape_ge_1mib_pct"] == sum(every) / len(every)
    # the text output ends with the same table
    assert main(["validate-collectives", str(CSV)]) == 0
    text = capsys.readouterr().out
    assert "system                rows  MAPE >= 1 MiB  MAPE < 1 MiB" in text
    for s in systems:
        assert any(line.split()[:2] == [s["system"], str(s["rows"])] for line in text.splitlines())


def test_readme_table_of_the_held_out_set_is_what_the_command_prints():
    import re

    import pytest

    from hetpar.validation_collectives import by_system, mape, run_file

    shared = Path(__file__).parents[2] / "shared" / "validation" / "collectives" / "measured.csv"
    if not shared.is_file():
        pytest.skip(f"no held-out set at {shared} (a checkout beside ../shared has it)")
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    shown = {m.group(1): (int(m.group(2)), float(m.group(3)), float(m.group(4)))
             for m in re.finditer(r"^\| ([\w-]+) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \|$",
                                  readme, re.M)}
    results = run_file(shared)
    rows = by_system(results) + [{"system": "all", "rows": len(results),
                                  "mape_ge_1mib_pct": mape(results, 2**20),
                                  "mape_lt_1mib_pct": mape(results, 0, 2**20)}]
    for row in rows:
        n, ge, lt = shown[str(row["system"])]
        assert n == row["rows"]
        assert abs(ge - float(row["mape_ge_1mib_pct"])) < 0.051  # type: ignore[arg-type]
        assert abs(lt - float(row["mape_lt_1mib_pct"])) < 0.051  # type: ignore[arg-type]
