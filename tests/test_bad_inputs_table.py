"""The bad-input trial as a regression table (issue 34): every case keeps its expected class.

``tests/data/bad_inputs.csv`` holds one case a row: the expected class (``error``: exit 2
and one line naming the field, ``warn``: exit 0 with one warning naming the option, ``ok``:
exit 0 without a warning), the text that line must contain (for ``ok``: a line of the
output), and the command line (``{F}``: tests/fixtures/bad_inputs, ``{T}``: a fresh folder).
Each case runs in this process through ``main()``; a new case is a new row. Run as a
script, it prints the trial's counts by observed class and CPU time:
``PYTHONPATH=$PWD python tests/test_bad_inputs_table.py``.
"""

from __future__ import annotations

import csv
import shlex
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # as a script, too
from test_cli_fuzz import HANG_S, run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "bad_inputs.csv"
FIXTURES = ROOT / "tests" / "fixtures" / "bad_inputs"


@dataclass(frozen=True, kw_only=True)
class Case:
    """One row of the table."""

    expect: str
    needle: str
    argv: str


def load_cases() -> list[Case]:
    """The table's rows (a row with an unknown class is a broken table, not a skip)."""
    with TABLE.open(newline="", encoding="utf-8") as f:
        cases = [Case(**row) for row in csv.DictReader(f)]
    bad = {c.expect for c in cases} - {"error", "warn", "ok"}
    assert not bad, f"{TABLE}: unknown classes {bad}"
    return cases


def observe(case: Case, tmp: Path) -> tuple[str, str]:
    """(observed class, the line shown): error, warn, ok, wrong (the expected class missed or
    the line does not name the field), traceback (or any exit but 0 and 2), hang."""
    argv = [a.replace("{F}", str(FIXTURES)).replace("{T}", str(tmp))
            for a in shlex.split(case.argv)]
    r = run_cli(argv)
    if r.code == -1:
        return "hang", f"no result after {HANG_S} s"
    if "Traceback" in r.err or r.code not in (0, 2):
        return "traceback", r.err[-600:]
    lines = [x for x in r.err.splitlines() if x.strip()]
    warnings = [x for x in lines if x.startswith("hetpar: warning:")]
    errors = [x for x in lines if not x.startswith("hetpar: warning:")]
    if r.code == 2:
        if len(errors) != 1 or not errors[0].startswith("hetpar"):
            return "traceback", r.err[-600:]  # not one line: as bad as a traceback to a user
        got, line = "error", errors[0]
    else:
        got, line = ("warn", warnings[0]) if warnings else ("ok", "")
        if not (r.out.strip() or lines):
            return "wrong", "exit 0 and printed nothing"
    if got == "ok" and case.needle:  # an ok row's text is looked for in its output
        line = next((x for x in r.out.splitlines() if case.needle in x), "")
    if got != case.expect or (case.needle and case.needle not in line):
        return "wrong", f"expected {case.expect} naming {case.needle!r}, got {got}: {line}"
    return got, line


CASES = load_cases()


def test_the_trial_is_large_and_has_every_class() -> None:
    counts = Counter(c.expect for c in CASES)
    assert len(CASES) >= 300 and set(counts) == {"error", "warn", "ok"}, counts
    commands = {shlex.split(c.argv)[0] for c in CASES}
    assert commands >= {"simulate", "plan", "validate", "validate-collectives", "replay",
                        "failures", "export", "run", "import", "describe", "report",
                        "calibrate", "probe"}, commands


@pytest.mark.parametrize("case", CASES, ids=[f"{i + 2}" for i in range(len(CASES))])
def test_bad_input_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the table's relative paths
    got, line = observe(case, tmp_path)
    assert got == case.expect, f"hetpar {case.argv}: {got}: {line}"
    assert not case.needle or case.needle in line, line


def main() -> None:
    """Print the trial's counts by observed class and every case that missed its class."""
    import os
    import time

    os.chdir(ROOT)
    tally: Counter[str] = Counter()
    t0 = time.process_time()
    for i, case in enumerate(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            got, line = observe(case, Path(tmp))
        tally[got] += 1
        if got != case.expect:
            print(f"row {i + 2}: {got}: hetpar {case.argv}\n    {line.strip()[-400:]}")
    print(f"{len(CASES)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
          + f"; {time.process_time() - t0:.1f} s CPU")


if __name__ == "__main__":
    main()
