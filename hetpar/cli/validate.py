"""Predict published training runs from a runs CSV and compare with what was measured.

With no file it validates the development set bundled with the package (396 published runs,
hetpar/catalog/validation/runs.csv; its README explains the columns); a file must have the same
columns (`schedule` and `framework` may be left out). For every row the simulator predicts
tokens/s per GPU; blank plan fields are chosen as a competent engineer would (the fastest
micro-batch / recompute mode that fits) and the choice is recorded in `reason`. The text output
is a per-source table of row counts, mean absolute percentage error (MAPE) and worst error,
the overall figures and the pairwise order accuracy.
``--leave-one-source-out`` predicts every row with parameters fitted without its source;
``--fit PATH`` fits the free parameters on the file and writes them (the bundled
catalog/fit/simulator.toml is that fit on runs.csv).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict

from hetpar.cli import progress
from hetpar.cli.options import check_output
from hetpar.ranking import (
    bundled_bands,
    coverage,
    held_out_intervals,
    interval,
    kind_of,
    misordered_pairs,
    pairwise_order,
    residual_bands,
    source_coverage,
)
from hetpar.validation.predict import RowResult, mape, predict_row
from hetpar.validation.rows import BUNDLED_RUNS, read_runs

NAME = "validate"
HELP = "predict published runs (a runs CSV) and report the error per source"
EXAMPLES = """examples:
  hetpar validate                            # the bundled development set
  hetpar validate --json > validation.json
  hetpar validate runs.csv --rows            # also one line per row
  hetpar validate runs.csv --leave-one-source-out --json
  hetpar validate ../shared/validation/runs.csv --fit hetpar/catalog/fit/simulator.toml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", metavar="RUNS.csv", nargs="?", default=str(BUNDLED_RUNS),
                   help="CSV of measured runs (runs.csv columns; default: the bundled "
                        "development set of published runs)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "mape_pct": ...} instead of the table; it '
                        'also lists the misordered pairs and the coverage per source')
    p.add_argument("--rows", action="store_true", help="text output: also one line per row")
    p.add_argument("--leave-one-source-out", action="store_true",
                   help="predict each row with parameters fitted without its source")
    p.add_argument("--fit", metavar="PATH",
                   help="fit the free parameters on RUNS.csv, write them (and the "
                        "leave-one-source-out intervals) to PATH, then validate with them")


def run(args: argparse.Namespace) -> int:
    from hetpar import validation_hetero as hv

    if hv.is_hetero_index(args.runs):
        return hv.run_cli(args.runs, as_json=args.json, per_row=args.rows)
    check_output(args.fit, "--fit", (".toml",))  # before the minutes of fitting
    if args.fit and args.leave_one_source_out:
        print("hetpar: warning: --leave-one-source-out with --fit: the rows are predicted "
              "with the fitted parameters; the fit's own leave-one-source-out MAPE is the line "
              "on stderr", file=sys.stderr)
    if args.rows and args.json:  # the JSON has every row already
        print("hetpar: warning: --rows applies to the text output; ignored with --json "
              "(its \"rows\" list has every row)", file=sys.stderr)
    rows = read_runs(args.runs)
    if args.fit:
        from hetpar.fit import fit, leave_one_source_out, write_fit

        params = fit(rows)
        held = _held_out(rows, leave_one_source_out(rows, start=params))
        write_fit(params, args.fit, args.runs, residual_bands(rows, held))
        print(f"wrote {args.fit}; leave-one-source-out (everything refitted): MAPE "
              f"{mape(held) or 0:.2f}%, 80% intervals {coverage(held) or 0:.1f}% inside",
              file=sys.stderr)
        results = [predict_row(r, fitted=params) for r in rows]
    elif args.leave_one_source_out:
        from hetpar.fit import leave_one_source_out

        results = _held_out(rows, leave_one_source_out(rows))
    else:
        results = _predict(rows, args)
    if args.fit or not args.leave_one_source_out:
        bands = bundled_bands()
        results = [_with_interval(r, kind_of(row), bands) for r, row in zip(results, rows,
                                                                             strict=True)]
    right, pairs = pairwise_order(rows, results)
    order = 100.0 * right / pairs if pairs else None
    covered = coverage(results)
    if args.json:
        json.dump({"rows": [r.to_dict() for r in results], "mape_pct": mape(results),
                   "pairwise_order_pct": order, "pairs": pairs,
                   "interval_coverage_pct": covered,
                   "interval_coverage_by_source": _coverage_by_source(rows, results),
                   "misordered_pairs": misordered_pairs(rows, results)},
                  sys.stdout, indent=1)
        print()
        return 0
    print(render(results, per_row=args.rows))
    if order is not None:
        print(f"pairwise order: {right}/{pairs} pairs ({order:.1f}%) in the measured order")
    if covered is not None:
        print(f"80% intervals: {covered:.1f}% of the measured values inside")
    return 0


def _held_out(rows: list[dict[str, str]], results: list[RowResult]) -> list[RowResult]:
    """Held-out predictions with each source's intervals from the other sources' held-out
    errors: coverage as on a source never seen."""
    from hetpar.fit import source_key

    spans = held_out_intervals(rows, results, source_key)
    return [dataclasses.replace(r, interval=s) for r, s in zip(results, spans, strict=True)]


def _coverage_by_source(rows: list[dict[str, str]],
                        results: list[RowResult]) -> dict[str, dict[str, object]]:
    from hetpar.fit import source_key

    by: dict[str, list[RowResult]] = {}
    for row, r in zip(rows, results, strict=True):
        by.setdefault(source_key(row), []).append(r)
    return {k: source_coverage(v) for k, v in by.items()}


def _predict(rows: list[dict[str, str]], args: argparse.Namespace) -> list[RowResult]:
    results = []
    with progress.bar(args, len(rows), "validating", unit="row") as bar:
        for row in rows:
            results.append(predict_row(row))
            bar.update()
    return results


def _with_interval(r: RowResult, kind: str, bands: dict[str, tuple[float, float]]) -> RowResult:
    if r.predicted is None:
        return r
    return dataclasses.replace(r, interval=interval(r.predicted, kind, bands))


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
        out.append(f"{'row':>6s} {'predicted':>11s} {'interval':>17s} {'measured':>11s} "
                   f"{'error':>8s}  reason")
        for r in results:
            pred = f"{r.predicted:11.1f}" if r.predicted is not None else f"{'-':>11s}"
            band = (f"{r.interval[0]:8.0f}-{r.interval[1]:<8.0f}" if r.interval
                    else f"{'-':>17s}")
            err = f"{r.error_pct:+7.1f}%" if r.error_pct is not None else f"{'-':>8s}"
            out.append(f"{r.row_id!s:>6s} {pred} {band} {r.measured:11.1f} {err}  {r.reason}")
    return "\n".join(out)
