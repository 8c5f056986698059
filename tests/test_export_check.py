"""``hetpar export --check``: the installed framework's own code reads the export (DeepSpeed's
DeepSpeedConfig, megatron-core's configs); a framework that is not installed is "not checked"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hetpar import catalog
from hetpar.cli import export as cli_export
from hetpar.cli.main import main
from hetpar.export import export, get
from hetpar.export.checks import _module
from hetpar.export.target import Check

LLAMA = catalog.load_model("llama3.1-8b")
PLAN = catalog.load_plan("tp=2,pp=2,dp=2,gbs=64,zero=1")


def test_deepspeed_refuses_a_broken_batch_in_its_own_words() -> None:
    pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed is not installed")
    e = export(PLAN, LLAMA, "deepspeed")
    assert get("deepspeed").check_export(e).accepted is True
    cfg = {**json.loads(e.files[0][1]), "train_batch_size": 63}  # not mbs x gas x dp
    bad = dataclasses.replace(e, files=((e.files[0][0], json.dumps(cfg)), *e.files[1:]))
    c = get("deepspeed").check_export(bad)
    assert c.accepted is False and "DeepSpeed" in c.message and "\n" not in c.message
    assert "batch" in c.message.lower(), c.message


def test_megatron_core_accepts_the_export() -> None:
    pytest.importorskip("megatron.core.transformer.transformer_config",
                        reason="megatron-core is not installed")
    c = get("megatron").check_export(export(PLAN, LLAMA, "megatron"))
    assert c.accepted is True and "argument parser not run" in c.message, c.message


def test_torchtitan_2026_08_is_not_checked_and_says_why() -> None:
    """Only the installed release's form is parsed (0.3.0: tests/test_export_torchtitan_parser.py);
    the default 2026-08 form is not that of any release on PyPI."""
    c = get("torchtitan").check_export(export(PLAN, LLAMA, "torchtitan"))
    assert c.accepted is None and c.message.startswith("not checked: ")
    assert ("torchtitan is not installed" in c.message) == (_module("torchtitan") is None)
    assert "2026-08 option table only" in c.message


def test_cli_not_checked_exits_0_and_reports_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--plan", "dp=2,gbs=8", "--model", "llama3.1-8b", "--to",
                 "torchtitan", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check"]["accepted"] is None and "not checked" in out["check"]["message"]


def test_cli_refusal_exits_2_with_the_framework_message_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = Check(accepted=False, message="Fake 1.0 refused it: AssertionError: no")
    target = dataclasses.replace(get("torchtitan"), check=lambda e: refused)
    monkeypatch.setattr(cli_export, "get", lambda name: target)
    assert main(["export", "--plan", "dp=2,gbs=8", "--model", "llama3.1-8b", "--to",
                 "torchtitan", "--check", "--out", str(tmp_path / "t.sh")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "hetpar: error: export --check: Fake 1.0 refused it: AssertionError: no"
    assert not list(tmp_path.iterdir())
