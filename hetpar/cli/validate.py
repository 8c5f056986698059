"""Predict published training runs from a runs CSV and compare with what was measured.

With no file it validates the development set bundled with the package (223 published runs,
hetpar/catalog/validation/runs.csv; its README explains the columns); a file must have the same
columns (`schedule` and `framework` may be left out). For every row the simulator predicts
tokens/s per GPU; blank plan fields are chosen as a competent engineer would (the fastest
micro-batch / recompute mode that fits) and the choice is recorded in `reason`. The text output
is a per-source table of row counts, mean absolute percentage error (MAPE) and worst error,
plus the overall figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from hetpar.cli import progress
from hetpar.validation import BUNDLED_RUNS, RowResult, mape, predict_row, read_runs

NAME = "validate"
HELP = "predict published runs (a runs CSV) and report the error per source"
EXAMPLES = """examples:
  hetpar validate                            # the bundled development set
  hetpar validate --json > validation.json
  hetpar validate runs.csv --rows            # also one line per row
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", metavar="RUNS.csv", nargs="?", default=str(BUNDLED_RUNS),
                   help="CSV of measured runs (runs.csv columns; default: the bundled "
                        "development set of published runs)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "mape_pct": ...} instead of the table')
    p.add_argument("--rows", action="store_true", help="text output: also one line per row")


def run(args: argparse.Namespace) -> int:
    rows = read_runs(args.runs)
    results = []
    with progress.bar(args, len(rows), "validating", unit="row") as bar:
        for row in rows:
            results.append(predict_row(row))
            bar.update()
    if args.json:
        json.dump({"rows": [r.to_dict() for r in results], "mape_pct": mape(results)},
                  sys.stdout, indent=1)
        print()
        return 0
    print(render(results, per_row=args.rows))
    return 0


def _line(name: str, rs: list[RowResult]) -> str:
    errs = [abs(e) for r in rs if (e := r.error_pct) is not None]
    ok = sum(r.status == "ok" for r in rs)
    m = f"{sum(errs) / len(errs):6.1f}" if errs else "     -"
    w = f"{max(errs):6.1f}" if errs else "     -"
    return f"{name[:44]:44s} {len(rs):5d} {ok:5d} {m}% {w}%"


def render(results: list[RowResult], *, per_row: bool = False) -> str:
    """Per-source table: rows, rows predicted ok, MAPE and worst absolute error."""
    by: dict[str, list[RowResult]] = defaultdict(list)
    for r in results:
        by[r.source].append(r)
    out = [f"{'source':44s} {'rows':>5s} {'ok':>5s} {'MAPE':>7s} {'worst':>7s}"]
    out += [_line(s, rs) for s, rs in by.items()]
    out.append(_line("all", results))
    bad = [r for r in results if r.status != "ok"]
    for r in bad:
        out.append(f"row {r.row_id}: {r.status}: {r.reason}")
    if per_row:
        out.append("")
        out.append(f"{'row':>6s} {'predicted':>11s} {'measured':>11s} {'error':>8s}  reason")
        for r in results:
            pred = f"{r.predicted:11.1f}" if r.predicted is not None else f"{'-':>11s}"
            err = f"{r.error_pct:+7.1f}%" if r.error_pct is not None else f"{'-':>8s}"
            out.append(f"{r.row_id!s:>6s} {pred} {r.measured:11.1f} {err}  {r.reason}")
    return "\n".join(out)
