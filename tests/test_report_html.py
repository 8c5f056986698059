"""The HTML report: built from a real simulation, opened in headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

from browser import inspect, require_browser

from hetpar.cli.main import main

ELEMENTS = """() => ({
  cards: document.querySelectorAll('#summary .card').length,
  segments: document.querySelectorAll('#breakdown .seg').length,
  memoryBars: document.querySelectorAll('#memory .mem').length,
  capacity: document.querySelectorAll('#memory .capacity').length,
  events: document.querySelectorAll('#timeline .ev').length,
  plans: document.querySelectorAll('#plans-table .plan-row').length,
  series: document.querySelectorAll('#curves .series').length,
})"""


def _make(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "report.html"
    code = main(["report", "--model", "llama3.1-8b", "--cluster", "selene-a100",
                 "--plan", "tp=2,pp=2,dp=2,mbs=1,gbs=16", "--out", str(out), *extra])
    assert code == 0
    return out


def _data(path: Path) -> dict:
    m = re.search(r'id="hetpar-data">(.*?)</script>', path.read_text(), re.S)
    assert m
    return json.loads(m.group(1))


def test_report_is_one_offline_file(tmp_path: Path) -> None:
    out = _make(tmp_path, "--compare", "tp=4,pp=2,dp=1,mbs=1,gbs=16")
    text = out.read_text()
    # Self-contained: no external scripts, styles or fetches.
    assert not re.search(r'<script[^>]+src=|<link[^>]+href=|https?://[^"\s]+\.js', text)
    data = _data(out)
    assert [p["name"] for p in data["plans"]] == ["tp=2,pp=2,dp=2,mbs=1,gbs=16",
                                                   "tp=4,pp=2,dp=1,mbs=1,gbs=16"]
    assert data["trace"]["traceEvents"], "the first plan's timeline is embedded"


def test_report_renders_in_a_browser(tmp_path: Path) -> None:
    require_browser()
    curves = tmp_path / "curves.json"
    curves.write_text(json.dumps({"curves": [{"title": "throughput", "x_label": "h",
                                               "y_label": "tok/s", "series": [
                                                   {"name": "static", "x": [0, 1, 2],
                                                    "y": [3, 2, 1]}]}]}))
    out = _make(tmp_path, "--compare", "tp=4,pp=2,dp=1,mbs=1,gbs=16", "--curves", str(curves))
    errors, found = inspect(out, ELEMENTS)
    assert errors == []
    rows = len(_data(out)["plans"][0]["report"]["memory"])
    assert rows >= 2  # pp = 2: at least one row per pipeline rank
    # One bar per memory component (5) per memory row, and one capacity mark per row.
    assert found["capacity"] == rows
    assert found["memoryBars"] == 5 * rows
    assert found["cards"] == 8
    assert found["segments"] >= 2
    assert found["events"] > 0
    assert found["plans"] == 2
    assert found["series"] == 1


def test_bad_curves_file_is_a_config_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "c.json"
    bad.write_text('{"curves": [{"series": [{"name": "a"}]}]}')
    code = main(["report", "--out", str(tmp_path / "r.html"), "--curves", str(bad)])
    assert code == 2
    assert "curve 0 is malformed" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def _json_of(capsys, argv: list[str], path: Path) -> Path:
    assert main(argv) == 0
    path.write_text(capsys.readouterr().out)
    return path


def test_curves_from_failure_and_replay_studies(tmp_path: Path, capsys) -> None:
    fail = _json_of(capsys, ["failures", "--days", "2", "--samples", "3", "--json"],
                    tmp_path / "failures.json")
    replay = _json_of(capsys, ["replay", "--model", "llama3.1-8b", "--job", "gbs=1024",
                               "--trace", "spine-degraded", "--policy", "all", "--json"],
                      tmp_path / "replay.json")
    out = _make(tmp_path, "--curves", str(fail), "--curves", str(replay))
    curves = _data(out)["curves"]
    assert [c["title"] for c in curves] == [
        "Throughput loss versus failed GPUs", "Throughput over time (Monte Carlo)",
        "Throughput over the spine-degraded trace"]
    assert {s["name"] for s in curves[2]["series"]} == {"static", "adaptive", "oracle"}
    assert "ntp" in {s["name"] for s in curves[0]["series"]}
    for c in curves:
        for s in c["series"]:
            assert len(s["x"]) == len(s["y"]) > 0


def test_plan_writes_a_report_of_its_ranked_plans(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plans.html"
    code = main(["plan", "--model", "llama3.1-8b", "--cluster", "mixed-a100-h100", "--job",
                 "default", "--top", "2", "--workers", "1", "--report", str(out)])
    assert code == 0
    data = _data(out)
    assert [p["name"][:3] for p in data["plans"]] == ["#1 ", "#2 "]
    rates = [p["report"]["tokens_per_s"] for p in data["plans"]]
    assert rates[0] >= rates[1] * 0.999  # ranked by throughput (the default objective)
    assert data["trace"]["traceEvents"]
