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


def test_a_forced_algorithm_without_the_collective_is_one_line(tmp_path, capsys):
    """NCCL's tree runs only all-reduce: forcing it on an all-gather row is an error naming the
    algorithm and the row's collective, not a bus bandwidth of 0 (-100%)."""
    rows = CSV.read_text(encoding="utf-8").splitlines()
    gather = [r for r in rows if ",all_gather," in r][:1]
    assert gather
    (tmp_path / "systems").mkdir()
    for f in (CSV.parent / "systems").glob("*.toml"):
        (tmp_path / "systems" / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    csv = tmp_path / "g.csv"
    csv.write_text("\n".join([rows[0], *gather]) + "\n", encoding="utf-8")
    assert main(["validate-collectives", str(csv), "--algorithm", "tree"]) == 2
    err = capsys.readouterr().err.strip()
    assert "algorithm 'tree' does not run all_gather" in err and len(err.splitlines()) == 1
    assert main(["validate-collectives", str(csv), "--algorithm", "ring"]) == 0


def _copy_systems(tmp_path):
    (tmp_path / "systems").mkdir()
    for f in (CSV.parent / "systems").glob("*.toml"):
        (tmp_path / "systems" / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")


def test_a_rows_algorithm_cell_prices_what_its_source_ran(tmp_path, capsys):
    """An optional ``algorithm`` column (NCCL_ALGO as the source set it) prices that row with
    that algorithm, as ``--algorithm`` would; an empty cell keeps the library's choice."""
    rows = CSV.read_text(encoding="utf-8").splitlines()
    big = [r for r in rows if r.startswith("67,")]  # a3mega-dstack all-gather, 1 GiB
    assert big
    _copy_systems(tmp_path)
    plain, cells = tmp_path / "plain.csv", tmp_path / "cells.csv"
    plain.write_text("\n".join([rows[0], *big]) + "\n", encoding="utf-8")
    cells.write_text("\n".join([rows[0] + ",algorithm", big[0] + ",ring",
                                big[0].replace("67,", "68,", 1) + ","]) + "\n", encoding="utf-8")

    def predicted(path, *extra):
        assert main(["validate-collectives", str(path), "--json", *extra]) == 0
        return [r["predicted_busbw_gbyte_s"] for r in json.loads(capsys.readouterr().out)["rows"]]

    ring = predicted(plain, "--algorithm", "ring")[0]
    default = predicted(plain)[0]
    assert predicted(cells) == [ring, default]
    # the command's --algorithm still forces every row
    forced = predicted(plain, "--algorithm", "hierarchical")
    assert forced != [ring] and predicted(cells, "--algorithm", "hierarchical") == forced * 2


def test_an_unknown_algorithm_cell_is_one_line(tmp_path, capsys):
    rows = CSV.read_text(encoding="utf-8").splitlines()
    _copy_systems(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([rows[0] + ",algorithm", rows[1] + ",warp"]) + "\n",
                   encoding="utf-8")
    assert main(["validate-collectives", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.csv:2: algorithm 'warp'; allowed:" in err and "ring" in err
    assert len(err.splitlines()) == 1
