"""Trace files: both formats parse to the same events; bad traces fail on their line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpar.catalog import load_cluster
from hetpar.cli.main import main
from hetpar.dynamic.state import timeline
from hetpar.dynamic.trace import load_trace, parse_csv, parse_json, trace_names
from hetpar.errors import ConfigError

CSV = """# a comment: with a colon that is not metadata
# name: tiny
# horizon_s: 600
# restart_s: 30
# source: made up for a test
t_s,kind,target,value,node,nodes
10,factor,link:zone-a/zone-b,0.5,,
20,down,nvlink:zone-a,,3,
30,leave,group:zone-b,,,2
40,slowdown,group:zone-a,2.5,1,
"""


def test_csv_and_json_give_the_same_events(tmp_path: Path) -> None:
    from_csv = parse_csv(CSV, "t.csv")
    doc = {"name": "tiny", "horizon_s": 600, "restart_s": 30, "sources": ["made up"],
           "events": [
               {"t_s": 10, "kind": "factor", "target": "link:zone-a/zone-b", "value": 0.5},
               {"t_s": 20, "kind": "down", "target": "nvlink:zone-a", "node": 3},
               {"t_s": 30, "kind": "leave", "target": "group:zone-b", "nodes": 2},
               {"t_s": 40, "kind": "slowdown", "target": "group:zone-a", "value": 2.5, "node": 1},
           ]}
    text = json.dumps(doc, indent=1)
    from_json = parse_json(text, "t.json")
    strip = [(e.t_s, e.kind, e.target, e.value, e.node, e.nodes) for e in from_csv.events]
    assert strip == [(e.t_s, e.kind, e.target, e.value, e.node, e.nodes) for e in from_json.events]
    assert from_csv.restart_s == from_json.restart_s == 30
    assert from_csv.horizon_s == 600 and from_csv.name == "tiny"
    assert from_csv.sources == ("made up for a test",)
    # JSON events remember their line for error messages, like CSV rows.
    assert [e.line for e in from_csv.events] == [7, 8, 9, 10]
    lines = text.splitlines()
    for e in from_json.events:
        assert '"t_s"' in lines[e.line - 1] or lines[e.line - 1].strip() == "{"


@pytest.mark.parametrize("row, words", [
    ("5,factor,link:zone-a/zone-b,0.5,,", ["line 8", "out of order"]),
    ("20,bandwidth,tier:dci,-3,,", ["line 8", "must be > 0"]),
    ("20,bandwidth,tier:dci,0,,", ["line 8", "must be > 0"]),
    ("20,explode,tier:dci,1,,", ["line 8", "kind 'explode'", "allowed"]),
    ("20,down,tier:dci,,,", ["line 8", "does not apply"]),
    ("20,factor,switch:x,1,,", ["line 8", "PREFIX:NAME"]),
    ("20,slowdown,group:zone-a,0.5,,", ["line 8", ">= 1"]),
    ("700,factor,tier:dci,1,,", ["line 8", "horizon_s"]),
    ("20,factor,tier:dci,fast,,", ["line 8", "expected a number"]),
])
def test_bad_rows_name_their_line(row: str, words: list[str]) -> None:
    text = "# horizon_s: 600\nt_s,kind,target,value,node,nodes\n" + "\n".join(
        ["1,factor,tier:dci,1,,", "2,factor,tier:dci,1,,", "3,factor,tier:dci,1,,",
         "4,factor,tier:dci,1,,", "10,factor,tier:dci,1,,", row])
    with pytest.raises(ConfigError) as e:
        parse_csv(text, "bad.csv")
    msg = str(e.value).replace("bad.csv:8", "line 8")
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("row, words", [
    ("10,factor,link:zone-a/zone-c,0.5,,", ["bad.csv:3", "unknown link 'zone-a/zone-c'", "known"]),
    ("10,leave,group:zone-x,,,1", ["bad.csv:3", "unknown node group 'zone-x'", "zone-a"]),
    ("10,factor,tier:spine,0.5,,", ["bad.csv:3", "unknown tier 'spine'", "dci"]),
    ("10,leave,group:zone-a,,,40", ["bad.csv:3", "leave 40 nodes", "32 are present"]),
    ("10,join,group:zone-a,,,1", ["bad.csv:3", "join 1 nodes", "0 are absent"]),
    ("10,down,nvlink:zone-a,,32,", ["bad.csv:3", "node 32 outside"]),
    ("10,down,pcie:zone-a,,,", ["bad.csv:3", "no pcie path"]),
])
def test_names_unknown_to_the_cluster_fail_on_their_line(row: str, words: list[str]) -> None:
    trace = parse_csv(f"# horizon_s: 600\nt_s,kind,target,value,node,nodes\n{row}\n", "bad.csv")
    with pytest.raises(ConfigError) as e:
        timeline(load_cluster("two-zone-a100"), trace)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_trace_exits_2_with_one_line(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("# horizon_s: 600\nt_s,kind,target,value,node,nodes\n"
                   "10,factor,link:zone-a/zone-b,0.5,,\n5,factor,link:zone-a/zone-b,1,,\n")
    code = main(["replay", "--model", "llama3.1-8b", "--job", "gbs=256", "--trace", str(bad),
                 "--policy", "static"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "bad.csv:4" in err and "out of order" in err


def test_unknown_link_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"horizon_s": 600,\n "events": [\n  {"t_s": 1, "kind": "down", '
                   '"target": "link:zone-a/nowhere"}\n ]}\n')
    code = main(["replay", "--model", "llama3.1-8b", "--job", "gbs=256", "--trace", str(bad),
                 "--cluster", "two-zone-a100"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "bad.json:3" in err and "unknown link 'zone-a/nowhere'" in err


def test_missing_header_and_columns() -> None:
    with pytest.raises(ConfigError, match="horizon_s"):
        parse_csv("t_s,kind,target\n", "x.csv")
    with pytest.raises(ConfigError, match="column row"):
        parse_csv("# horizon_s: 5\ntime,kind,target\n", "x.csv")
    with pytest.raises(ConfigError, match="unknown key 'when'"):
        parse_json('{"horizon_s": 5, "events": [{"when": 1}]}', "x.json")


def test_bundled_traces_load_and_fit_their_clusters() -> None:
    names = trace_names()
    assert {"interzone-fluctuation", "spine-degraded", "spot-preemptions", "straggler-node",
            "flapping-link"} <= set(names)
    for name in names:
        trace = load_trace(name)
        assert trace.sources, f"{name} cites no source for its shape"
        steps = timeline(load_cluster(trace.cluster), trace)
        assert len(steps) >= 2


def test_files_with_a_bom_and_crlf_load(tmp_path: Path) -> None:
    f = tmp_path / "win.csv"
    f.write_bytes("\ufeff# horizon_s: 60\r\nt_s,kind,target,value\r\n1,factor,tier:dci,0.5\r\n"
                  .encode("utf-8"))
    trace = load_trace(str(f))
    assert trace.horizon_s == 60 and trace.events[0].value == 0.5 and trace.events[0].line == 3
