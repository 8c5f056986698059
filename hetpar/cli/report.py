"""Write a self-contained HTML report of one or more plans (timeline, memory, breakdown, curves).

The first plan is simulated with a timeline; further plans (--compare, or every plan file in
--plans-dir) appear side by side in the plans table. Curves from a replay or failure study
(their --json output) can be added with --curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hetpar.errors import ConfigError

NAME = "report"
HELP = "write a self-contained HTML report of a plan (timeline, memory, breakdown, curves)"
EXAMPLES = """examples:
  hetpar report --out report.html
  hetpar report --model llama3.1-70b --cluster selene-a100 \\
      --plan tp=8,pp=4,dp=4,mbs=1,gbs=512 --compare tp=4,pp=8,dp=4,mbs=1,gbs=512 --out r.html
  hetpar plan --model llama3.1-8b --cluster mixed-a100-h100 --job llama3.1-8b --out plans/
  hetpar report --model llama3.1-8b --cluster mixed-a100-h100 --plans-dir plans/ --out r.html
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hetpar.cli.simulate import DEFAULT_CLUSTER, DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help="catalog name or file")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help="catalog name or file")
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
        refs.extend(str(p) for p in sorted(d.glob("*.toml")))
    refs.extend(args.compare)
    if not refs:
        from hetpar.cli.simulate import DEFAULT_PLAN

        refs.append(DEFAULT_PLAN)
    return refs


def load_curves(path: str) -> list[Any]:
    """Curves from a JSON file: a list under "curves", each {title, x_label, y_label, series}."""
    from hetpar.report import Curve

    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--curves {path}: cannot read JSON: {str(e).splitlines()[0]}") from None
    raw = data.get("curves") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ConfigError(f"--curves {path}: expected an object with a 'curves' list")
    out = []
    for i, c in enumerate(raw):
        try:
            series = tuple(
                (str(s["name"]), tuple(map(float, s["x"])), tuple(map(float, s["y"])))
                for s in c["series"]
            )
            out.append(Curve(title=str(c.get("title", "")), x_label=str(c.get("x_label", "")),
                             y_label=str(c.get("y_label", "")), series=series))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"--curves {path}: curve {i} is malformed ({e})") from None
    return out


def run(args: argparse.Namespace) -> int:
    from hetpar.catalog import load_cluster, load_job, load_model, load_plan
    from hetpar.report import ReportBundle, write_report
    from hetpar.sim import simulate
    from hetpar.sim.timeline import chrome_trace

    model, cluster = load_model(args.model), load_cluster(args.cluster)
    job = load_job(args.job) if args.job else None
    curves = [c for path in args.curves for c in load_curves(path)]
    plans: list[dict[str, Any]] = []
    trace = None
    for i, ref in enumerate(_plan_refs(args)):
        plan = load_plan(ref)
        report = simulate(model, cluster, plan, job, timeline=(i == 0))
        if report.timeline is not None:
            trace = chrome_trace(report.timeline)
        data = report.to_dict()
        data.pop("timeline", None)
        plans.append({"name": plan.name or (Path(ref).stem if Path(ref).is_file() else ref),
                      "report": data})
    title = f"{model.name} on {cluster.name}"
    write_report(args.out, ReportBundle(title=title, plans=tuple(plans), trace=trace,
                                        curves=tuple(curves)))
    print(f"wrote {args.out} ({len(plans)} plan(s), {len(curves)} curve(s))")
    return 0
