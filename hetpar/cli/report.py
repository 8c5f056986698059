"""Write a self-contained HTML report of one or more plans (timeline, memory, breakdown, curves).

The first plan is simulated with a timeline; further plans (--compare, or every plan file in
--plans-dir) appear side by side in the plans table. Curves from a replay or failure study
(their --json output) can be added with --curves.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from hetpar.cli.options import check_output
from hetpar.errors import ConfigError
from hetpar.io import parse_json

NAME = "report"
HELP = "write a self-contained HTML report of a plan (timeline, memory, breakdown, curves)"
EXAMPLES = """examples:
  hetpar report --out report.html
  hetpar report --model llama3.1-70b --cluster selene-a100 \\
      --plan tp=8,pp=4,dp=4,mbs=1,gbs=512 --compare tp=4,pp=8,dp=4,mbs=1,gbs=512 --out r.html
  hetpar plan --model llama3.1-8b --cluster mixed-a100-h100 --job default --out plans/
  hetpar report --model llama3.1-8b --cluster mixed-a100-h100 --plans-dir plans/ --out r.html
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hetpar.cli.simulate import DEFAULT_CLUSTER, DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help="catalog name or file")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help="catalog name, file, or inline gpu=NAME,nodes=N")
    p.add_argument("--plan", default=None, help="catalog name, file or inline plan")
    p.add_argument("--job", default=None, help="catalog name or file (optional)")
    p.add_argument("--compare", action="append", default=[], metavar="PLAN",
                   help="another plan to show beside the first (repeatable)")
    p.add_argument("--plans-dir", default=None, metavar="DIR",
                   help="a directory of plan files (e.g. from `hetpar plan --out`); ranked order")
    p.add_argument("--curves", action="append", default=[], metavar="JSON",
                   help="curves to plot: the --json output of `hetpar replay` or `hetpar failures`")
    p.add_argument("--out", required=True, help="the HTML file to write")


def _plan_refs(args: argparse.Namespace) -> list[str]:
    refs: list[str] = []
    if args.plan:
        refs.append(args.plan)
    if args.plans_dir:
        d = Path(args.plans_dir)
        if not d.is_dir():
            raise ConfigError(f"--plans-dir: {d} is not a directory")
        found = sorted(d.glob("*.toml"), key=_plan_order)
        if not found:
            raise ConfigError(f"--plans-dir: no plan files (*.toml) in {d}")
        refs.extend(str(p) for p in found)
    refs.extend(args.compare)
    if not refs:
        from hetpar.cli.simulate import DEFAULT_PLAN

        refs.append(DEFAULT_PLAN)
    return refs


def _plan_order(p: Path) -> tuple[int, str]:
    """plan-2.toml before plan-10.toml (the planner's rank), other names after, by name."""
    m = re.fullmatch(r"plan-(\d+)\.toml", p.name)
    return (int(m.group(1)), "") if m else (1 << 30, p.name)


def load_curves(path: str) -> list[Any]:
    """Curves from a JSON file: the --json output of `hetpar failures` or `hetpar replay`, or
    an object with a "curves" list, each {title, x_label, y_label, series: [{name, x, y}]}."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--curves {path}: cannot read: {str(e).splitlines()[0]}") from None
    data = parse_json(text, f"--curves {path}")
    try:
        if isinstance(data, dict) and "sweep" in data and "monte_carlo" in data:
            return _failure_curves(data)
        if isinstance(data, dict) and "results" in data and "trace" in data:
            return [_replay_curve(data)]
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"--curves {path}: unexpected layout ({e!r})") from None
    raw = data.get("curves") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ConfigError(
            f"--curves {path}: expected the --json output of `hetpar failures` or "
            "`hetpar replay`, or an object with a 'curves' list"
        )
    return [_curve(c, f"--curves {path}: curve {i}") for i, c in enumerate(raw)]


def _curve(c: Any, where: str) -> Any:
    from hetpar.report import Curve

    try:
        series = tuple(
            (str(s["name"]), tuple(map(float, s["x"])), tuple(map(float, s["y"])))
            for s in c["series"]
        )
        if any(len(x) != len(y) for _, x, y in series):
            raise ValueError("x and y differ in length")
        return Curve(title=str(c.get("title", "")), x_label=str(c.get("x_label", "")),
                     y_label=str(c.get("y_label", "")), series=series)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{where} is malformed ({e})") from None


def _failure_curves(data: dict[str, Any]) -> list[Any]:
    sweep, series = data["sweep"], data["monte_carlo"]["series"]
    pct = [100 * f for f in sweep["fractions"]]
    loss = {"title": "Throughput loss versus failed GPUs", "x_label": "failed GPUs (%)",
            "y_label": "loss (%)",
            "series": [{"name": k, "x": pct, "y": [100 * v for v in ys]}
                       for k, ys in sweep["loss"].items()]}
    over = {"title": "Throughput over time (Monte Carlo)", "x_label": "hours",
            "y_label": "throughput (fraction of healthy)",
            "series": [{"name": k, "x": series["hours"], "y": ys}
                       for k, ys in series["throughput"].items()]}
    return [_curve(loss, "failures sweep"), _curve(over, "failures series")]


def _replay_curve(data: dict[str, Any]) -> Any:
    out = []
    for r in data["results"]:
        xs: list[float] = []
        ys: list[float] = []
        for seg in r["segments"]:  # a step function: each segment's rate from start to end
            xs += [seg["t_s"] / 3600, seg["end_s"] / 3600]
            ys += [seg["tokens_per_s"], seg["tokens_per_s"]]
        out.append({"name": r["policy"], "x": xs, "y": ys})
    curve = {"title": f"Throughput over the {data['trace']} trace", "x_label": "hours",
             "y_label": "tokens/s", "series": out}
    return _curve(curve, "replay results")


def write_plans_report(
    out: str, model: Any, cluster: Any, job: Any, plans: list[tuple[str, Any]],
    curves: list[Any] | None = None,
) -> None:
    """Simulate ``plans`` (the first with a timeline) and write them as one HTML report."""
    from hetpar.report import ReportBundle, write_report
    from hetpar.sim import breakdown, simulate
    from hetpar.sim.timeline import chrome_trace

    shown: list[dict[str, Any]] = []
    trace = None
    for i, (name, plan) in enumerate(plans):
        report = simulate(model, cluster, plan, job, timeline=(i == 0))
        if report.timeline is not None:
            trace = chrome_trace(report.timeline)
        data = report.to_dict()
        data.pop("timeline", None)
        shown.append({"name": name, "report": data})
    title = f"{model.name} on {cluster.name}"
    write_report(out, ReportBundle(title=title, plans=tuple(shown), trace=trace,
                                   curves=tuple(curves or ()), terms=tuple(breakdown.payload())))


def run(args: argparse.Namespace) -> int:
    from hetpar.catalog import load_cluster, load_job, load_model, load_plan

    check_output(args.out, "--out")
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    job = load_job(args.job) if args.job else None
    curves = [c for path in args.curves for c in load_curves(path)]
    plans = []
    for ref in _plan_refs(args):
        plan = load_plan(ref)
        plans.append((plan.name or (Path(ref).stem if Path(ref).is_file() else ref), plan))
    write_plans_report(args.out, model, cluster, job, plans, curves)
    print(f"wrote {args.out} ({len(plans)} plan(s), {len(curves)} curve(s))")
    return 0
