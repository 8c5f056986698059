"""Mutation check: zero one cost term of one cost model and see which test fails (issue 34).

Run: PYTHONPATH=$PWD .venv/bin/python bench/mutation.py [--only MODEL:TERM ...] [--exclude FILE ...]
[--check-targets]. For every (model, term) it runs ``pytest -x -q -p mutation`` on that
model's test files with ``HETPAR_MUTATE=<model>:<term>``; this file is also the pytest plugin,
whose ``pytest_configure`` monkeypatches the product code (the mutations: bench/mutants.py)
before any test runs. A term a model does not have is ``n/a`` with the reason. Prints the
table model x term -> killed (first failing test) / SURVIVED (with the patched names no test
called, if any) / timeout, after a baseline run of each model's tests without a mutation
(they must pass, or a kill means nothing). A patched name that no longer exists in hetpar
stops the bench first, exit 3 naming it (``--check-targets`` checks only that).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from mutants import HITS, MUTATORS, NA, TERMS, MissingTarget

ROOT = Path(__file__).resolve().parent.parent
# The tests each model is held by (cheap files: the whole table runs in ~15 min on 2 cores).
TESTS = {
    "sim": ["tests/test_sim_invariants.py", "tests/test_sim_pipeline.py",
            "tests/test_sim_compute.py", "tests/test_sim_ep.py", "tests/test_mutation_terms.py"],
    "failures": ["tests/test_failures_closed_forms.py", "tests/test_analytic_vs_sim.py"],
    "failures-sim": ["tests/test_failures_closed_forms.py", "tests/test_failures_policies.py",
                     "tests/test_analytic_vs_sim.py", "tests/test_mutation_terms.py"],
    "dynamic": ["tests/test_analytic_vs_sim.py", "tests/test_mutation_terms.py"],
    "search": ["tests/test_search_bounds.py", "tests/test_mutation_terms.py"],
}

MISSING_RC = 3
"""main's exit status when a patched name is gone (renamed or removed in the product)."""
REPORT = "HETPAR_MUTATE_REPORT"
"""The file where the plugin writes how often each patched target ran, or which is missing."""


def pytest_configure(config: Any) -> None:
    """Apply ``HETPAR_MUTATE`` before the tests import anything that caches."""
    spec = os.environ.get("HETPAR_MUTATE")
    if spec:
        model, term = spec.split(":")
        try:
            MUTATORS[model](term)
        except MissingTarget as e:
            _report({"missing": str(e)})
            raise pytest.UsageError(f"{_gone(spec, str(e))}") from None


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Tell the bench how often each patched target ran."""
    if os.environ.get("HETPAR_MUTATE"):
        _report({"hits": HITS})


def _report(data: dict[str, Any]) -> None:
    path = os.environ.get(REPORT)
    if path:
        Path(path).write_text(json.dumps(data))


def _gone(spec: str, names: str) -> str:
    return (f"bench/mutation.py: {spec} patches {names}, which no longer exists in hetpar: "
            "update the mutation to the new name")


def check_targets(pairs: list[tuple[str, str]]) -> str | None:
    """Apply each mutation in this process, which runs no test (the pytest runs are
    subprocesses): the first missing target's message, or None when every name exists."""
    for model, term in pairs:
        if (model, term) not in NA:
            try:
                MUTATORS[model](term)
            except MissingTarget as e:
                return _gone(f"{model}:{term}", str(e))
    return None


def run_one(model: str, term: str, limit: float, exclude: tuple[str, ...] = ()
            ) -> tuple[str, float]:
    """Run the model's tests under the mutation (none for ``term`` ''): (verdict, seconds);
    the verdict starts with 'missing' when a patched name is gone."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ, HETPAR_MUTATE=f"{model}:{term}" if term else "",
                   PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'bench'}", **{REPORT: str(report)})
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "mutation",
               "-p", "no:cacheprovider", *(t for t in TESTS[model] if t not in exclude)]
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=limit)
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - t0
        dt = time.monotonic() - t0
        got = json.loads(report.read_text()) if report.exists() else {}
    if "missing" in got:
        return f"missing {got['missing']}", dt
    if out.returncode == 0:
        idle = [k for k, n in got.get("hits", {}).items() if n == 0]
        return "SURVIVED" + (f" (never called: {', '.join(idle)})" if idle else ""), dt
    hit = re.search(r"^FAILED (\S+)", out.stdout, re.M)
    if hit is None:
        return f"error rc={out.returncode}: {out.stdout.strip().splitlines()[-1:]}", dt
    return f"killed by {hit.group(1)}", dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="MODEL:TERM pairs to run")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds per pair")
    ap.add_argument("--exclude", nargs="*", default=[],
                    help="test files left out (to see what survives without them)")
    ap.add_argument("--check-targets", action="store_true",
                    help="only check that every name the mutations patch exists (seconds)")
    args = ap.parse_args()
    pairs = [(m, t) for m, t in (p.split(":") for p in args.only)] or [
        (m, t) for m in MUTATORS for t in TERMS]
    gone = check_targets(pairs)  # before any test run: a renamed target is not a survivor
    if gone or args.check_targets:
        print(gone or f"every target of {len(pairs)} mutations exists",
              file=sys.stderr if gone else sys.stdout)
        return MISSING_RC if gone else 0
    survived = 0
    print("| model | term | result | s |\n|---|---|---|---|")
    for model in dict.fromkeys(m for m, _ in pairs):  # a kill means nothing if they fail anyway
        verdict, dt = run_one(model, "", args.limit, tuple(args.exclude))
        print(f"| {model} | (none) | baseline {'passes' if verdict == 'SURVIVED' else verdict} "
              f"| {dt:.0f} |", flush=True)
        if verdict != "SURVIVED":
            return 2
    for model, term in pairs:
        if (model, term) in NA:
            print(f"| {model} | {term} | n/a: {NA[model, term]} | |", flush=True)
            continue
        verdict, dt = run_one(model, term, args.limit, tuple(args.exclude))
        if verdict.startswith("missing"):
            print(_gone(f"{model}:{term}", verdict.removeprefix("missing ")), file=sys.stderr)
            return MISSING_RC
        survived += not verdict.startswith("killed")
        print(f"| {model} | {term} | {verdict} | {dt:.0f} |", flush=True)
    print(f"{survived} not killed")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
