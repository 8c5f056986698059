"""Smoke tests of the CLI: every subcommand has help with an example; README examples run."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from hetpar.cli.main import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def _names() -> list[str]:
    import importlib

    return [importlib.import_module(m).NAME for m in COMMANDS]


@pytest.mark.parametrize("name", _names())
def test_every_command_has_help_with_an_example(name: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    text = out.getvalue()
    assert f"hetpar {name}" in text
    assert "example" in text.lower(), f"`hetpar {name} --help` shows no example"


def test_top_level_help_lists_every_command() -> None:
    text = build_parser().format_help()
    for name in _names():
        assert name in text


def readme_examples() -> list[str]:
    """Commands in README.md shown as `$ hetpar ...` lines (the worked examples)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [m.group(1).strip() for m in re.finditer(r"^\$ (hetpar .+)$", text, re.M)]


@pytest.mark.parametrize("command", readme_examples())
def test_readme_example_runs(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    shared = [a for a in argv if a.startswith("../shared/") and not (ROOT / a).exists()]
    if shared and not os.environ.get("CI"):
        pytest.skip(f"{shared[0]} is not beside this checkout (CI has it)")
    # Outputs go to a temporary folder so the test leaves nothing behind.
    argv = [str(tmp_path / Path(a).name) if a.startswith("out/") else a for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, f"{command!r} exited {code}: {err.getvalue()[-500:]}"
    assert out.getvalue().strip() or os.listdir(tmp_path), f"{command!r} printed nothing"
