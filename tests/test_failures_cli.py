"""`hetpar failures`: output, JSON, plots, written plans, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from hetpar.catalog import load_plan
from hetpar.cli.main import main

SMALL = ["--model", "llama3.1-8b", "--cluster", "h100-pod-400g", "--plan",
         "tp=8,pp=2,dp=64,mbs=1,gbs=256", "--days", "5", "--samples", "5",
         "--fractions", "0.002,0.01", "--cost", "analytic"]


def test_text_and_json(capsys):
    assert main(["failures", *SMALL]) == 0
    out = capsys.readouterr()
    assert "throughput loss" in out.out and "spares needed" in out.out
    assert out.err == ""  # progress only where stderr is a terminal
    assert main(["failures", *SMALL, "--json", "--seed", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["monte_carlo"]["policies"]) == {
        "drop", "drop-packed", "spare", "checkpoint", "ntp", "ntp-boost"}
    assert data["setup"]["domain_size"] == 8 and data["setup"]["replicas"] == 64
    assert main(["failures", *SMALL, "--json", "--seed", "3"]) == 0
    assert json.loads(capsys.readouterr().out) == data  # deterministic for a seed


def test_plot_and_plan(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="plots need the 'plot' extra")
    png, plan = tmp_path / "f.png", tmp_path / "ntp.toml"
    assert main(["failures", *SMALL, "--policy", "drop-packed,ntp", "--plot", str(png),
                 "--write-plan", str(plan), "--failed-fraction", "0.01"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    p = load_plan(str(plan))
    assert p.replicas and p.batch <= 256
    assert "wrote ntp plan" in capsys.readouterr().out


@pytest.mark.parametrize("extra, match", [
    (["--failed-fraction", "1.5"], "--failed-fraction: 1.5 not allowed; allowed: >= 0 and < 1"),
    (["--policy", "nope"], "--policy 'nope' unknown"),
    (["--plan", "tp=8,pp=2,dp=128,gbs=256"], "has 1024; allowed: at most 1024"),
    (["--rates", "nope"], "unknown failure-rate preset"),
    (["--fractions", "2"], "--fractions '2': allowed: numbers in 0..1"),
])
def test_bad_input_is_one_line_exit_2(capsys, extra, match):
    assert main(["failures", *SMALL, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert match in err[-1] and err[-1].startswith("hetpar: error:")
    assert not any("Traceback" in line for line in err)


def test_rate_above_one_and_domain_larger_than_group(tmp_path, capsys):
    rates = tmp_path / "r.toml"
    rates.write_text('name = "r"\nevents = 5.0\ngpus = 1\ndays = 1.0\n[[classes]]\n'
                     'name = "hw"\nshare = 1.0\nrepair = { mean_hours = 1.0 }\n')
    assert main(["failures", *SMALL, "--rates", str(rates)]) == 2
    assert "failures per GPU-day; allowed: 0..1" in capsys.readouterr().err
    cl = tmp_path / "c.toml"
    cl.write_text('name = "c"\n[[node_groups]]\nname = "g"\ngpu = "B200"\nnum_nodes = 2\n'
                  'gpus_per_node = 4\nscaleup_size = 32\n')
    assert main(["failures", *SMALL, "--cluster", str(cl)]) == 2
    assert "scaleup_size (32)" in capsys.readouterr().err
