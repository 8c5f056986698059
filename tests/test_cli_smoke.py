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


def test_command_names_and_helps_read_from_source_are_the_modules_own() -> None:
    import importlib

    from hetpar.cli.main import _header

    for modname in COMMANDS:
        mod = importlib.import_module(modname)
        assert _header(modname) == (mod.NAME, mod.HELP), modname


def test_a_command_imports_only_its_own_module() -> None:
    import subprocess
    import sys

    code = ("import sys; from hetpar.cli.main import main; "
            "main(['simulate', '--model', 'tiny-llama', '--cluster', 'h100-pod-400g', "
            "'--plan', 'dp=2,gbs=8']); "
            "print([m for m in ('hetpar.cli.plan', 'hetpar.cli.run', 'hetpar.search.planner', "
            "'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.splitlines()[-1] == "[]"


def test_python_dash_m_runs_the_same_entry_point() -> None:
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "hetpar.cli", "--help"], capture_output=True,
                        text=True, cwd=ROOT)
    assert ok.returncode == 0 and "simulate" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "hetpar.cli", "simulate", "--bogus"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--bogus" in bad.stderr and "Traceback" not in bad.stderr


def readme_blocks() -> list[tuple[str, list[str]]]:
    """README code blocks that start with a `$ hetpar ...` line: (command, shown output)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = []
    for m in re.finditer(r"^```\n\$ (hetpar [^\n]+)\n(.*?)^```$", text, re.M | re.S):
        out.append((m.group(1).strip(), m.group(2).splitlines()))
    return out


def readme_examples() -> list[str]:
    """Commands in README.md shown as `$ hetpar ...` lines (the worked examples)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [m.group(1).strip() for m in re.finditer(r"^\$ (hetpar .+)$", text, re.M)]


# Golden README outputs. Every line the README shows must appear, in order, in what the
# command prints today (the README may leave lines out, e.g. a replay's switch list, or mark a
# cut with `...`). Text must match exactly (runs of spaces aside: a wider number shifts
# columns); numbers within REL_TOL, except figures that measure this machine's speed (TIMING):
# those are normalised away, any figure >= 0 matches, because a test must not measure speed
# (a shared CI machine at load 12 took 42 s for a search the README shows as 1.9 s; speed
# targets live in bench/). `calibrate` measures this machine: every figure is a timing.
REL_TOL = 1e-3
TIMING = {  # what follows a figure that measures speed, by command
    "run": re.compile(r" s\b"),  # step times; the losses are exact
    "plan": re.compile(r" s, | plans/s"),  # the search's own wall time
    "calibrate": re.compile(r""),  # every figure is a measurement
}
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?")


def _numbers(line: str, timing: re.Pattern[str] | None) -> list[tuple[float, bool]]:
    """The figures of ``line``, each with whether it is a timing figure."""
    return [(float(m.group().rstrip("%").replace(",", "")),
             timing is not None and timing.match(line, m.end()) is not None)
            for m in NUMBER.finditer(line)]


def _close(a: float, b: float, is_timing: bool) -> bool:
    if is_timing:  # normalised: any measured figure stands for the README's
        return a >= 0 and b >= 0
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def _line_matches(shown: str, got: str, timing: re.Pattern[str] | None) -> bool:
    if " ".join(NUMBER.sub("#", shown).split()) != " ".join(NUMBER.sub("#", got).split()):
        return False
    ns, ng = _numbers(shown, timing), _numbers(got, None)
    return all(_close(a, b, t) for (a, t), (b, _) in zip(ns, ng, strict=True))


def check_golden(command: str, shown: list[str], printed: str) -> None:
    """Assert ``shown`` (README lines) appear in order in ``printed``, within the tolerances."""
    timing = TIMING.get(shlex.split(command)[1])
    got = [g.rstrip() for g in printed.splitlines()]
    i = 0
    for line in (s.rstrip() for s in shown):
        if line == "...":
            continue
        while i < len(got) and not _line_matches(line, got[i], timing):
            i += 1
        assert i < len(got), (f"README line of `{command}` is no longer printed:\n  {line}\n"
                              "printed:\n" + "\n".join(got))
        i += 1


def _run_readme(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    # Outputs go to a temporary folder so the test leaves nothing behind; the printed paths
    # are mapped back to the README's out/.
    argv = [str(tmp_path / Path(a).name) if a.startswith("out/") else a for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, f"{command!r} exited {code}: {err.getvalue()[-500:]}"
    assert out.getvalue().strip() or os.listdir(tmp_path), f"{command!r} printed nothing"
    printed = err.getvalue() + out.getvalue()
    return printed.replace(str(tmp_path) + os.sep, "out/")


@pytest.mark.parametrize("command", readme_examples())
def test_readme_example_runs_and_prints_what_the_readme_shows(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = _run_readme(command, tmp_path, monkeypatch)
    shown = dict(readme_blocks()).get(command)
    assert shown is not None, f"README shows no output for `{command}`"
    check_golden(command, shown, printed)


def test_readme_commands_need_nothing_beside_the_checkout() -> None:
    # a fresh clone has no ../shared: no README command may need it
    assert [c for c in readme_examples() if "../" in c] == []


def test_golden_check_catches_a_changed_figure() -> None:
    shown = ["  throughput               155,777 tokens/s  (2,434.0 per GPU)"]
    check_golden("hetpar simulate", shown, "  throughput    155,777 tokens/s  (2,434.0 per GPU)")
    with pytest.raises(AssertionError, match="no longer printed"):
        check_golden("hetpar simulate", shown, "  throughput  156,777 tokens/s  (2,434.0 per GPU)")
    # a step time is normalised (any figure), whatever the machine's load; the loss is not
    check_golden("hetpar run", ["step 0: loss 5.577365  0.0778 s"], "step 0: loss 5.5773650  42 s")
    with pytest.raises(AssertionError):
        check_golden("hetpar run", ["step 0: loss 5.577365  0.0778 s"], "step 0: loss 5.6  0.07 s")
    check_golden("hetpar plan", ["  1807 evaluated in 1.90 s, 951 plans/s"],
                 "  1807 evaluated in 185.16 s, 10 plans/s")
    with pytest.raises(AssertionError):
        check_golden("hetpar plan", ["  1807 evaluated in 1.90 s, 951 plans/s"],
                     "  1907 evaluated in 1.90 s, 951 plans/s")
